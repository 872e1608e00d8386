"""The ``toolservices`` command line."""

from toolservices.cli.main import main

__all__ = ["main"]
