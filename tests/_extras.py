"""Skip a test directory whose extra is not installed, with the reason.

A directory's ``conftest.py`` must not skip while it is imported: pytest loads
the conftest of a directory named on the command line before it collects, and a
skip raised there ends the run with a traceback. So such a conftest asks
:func:`missing` which modules are absent and, if any is, installs
:func:`skip_every_module`'s hook and imports nothing that needs them: every test
module of the directory is then reported as skipped, with the reason, and never
imported.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest


def missing(*modules: str) -> str | None:
    """Why the directory's tests cannot run here (``None``: every module imports)."""
    for name in modules:
        try:
            importlib.import_module(name)
        except ModuleNotFoundError as exc:  # as pytest.importorskip decides
            return f"could not import {name!r} (an extra that is not installed): {exc}"
    return None


class _Skipped(pytest.Module):
    """A test module that is not imported: collecting it skips with ``reason``."""

    reason = ""

    def collect(self) -> Any:
        pytest.skip(self.reason)


def skip_every_module(reason: str) -> Callable[..., pytest.Module]:
    """A ``pytest_pycollect_makemodule`` hook for a conftest: each module skips."""

    def pytest_pycollect_makemodule(module_path: Path, parent: Any) -> pytest.Module:
        module = _Skipped.from_parent(parent, path=module_path)
        module.reason = reason
        return module

    return pytest_pycollect_makemodule
