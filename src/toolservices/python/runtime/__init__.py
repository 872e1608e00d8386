"""The runtime side: what runs in the fork server, the sessions and the launcher.

Everything in this package imports only the standard library and its own
modules (relatively), so that the processes it runs in do not carry the rest
of ``toolservices`` (pydantic, anyio, the trainer's imports). Those processes
start it one way: by the path of an entry module (:func:`script`), whose
first lines load this directory as the package ``_toolservices_runtime``
(see ``_bootstrap``). The parent imports the same modules as
``toolservices.python.runtime``.
"""

from __future__ import annotations

import os

__all__ = ["RUNTIME_DIR", "script"]

RUNTIME_DIR = os.path.dirname(os.path.abspath(__file__))


def script(name: str) -> str:
    """The path of the entry module ``name`` (``"_forkserver"``, ``"_launch"``...)."""
    return os.path.join(RUNTIME_DIR, f"{name}.py")
