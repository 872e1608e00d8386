"""Persistent, sandboxed shell sessions: commands and files for agent episodes.

* :class:`ShellService`: a pool of shell sessions (``run``/``arun``, file
  tools, ``fork_session``, ``close_session``) on the Python executor's
  sandboxed sessions and isolation layers;
* :class:`ShellResult`: one command's outcome, a mapping like ``ExecResult``;
* :class:`FileEntry`, :class:`ShellFileError`: what the file tools return and raise;
  :class:`ShellArgumentError`: an argument no file or text can be (both a
  ``UserError`` and a ``ShellFileError``).

Layout: ``_service`` (with ``_requests``, ``_config``, ``_report``, ``_checks``,
``_result``) runs in the caller's process; ``_supervisor`` (with ``_spawner``,
``_terminal``) is sent to each session and runs there (standard library only).
See ``docs/shell.md``.
"""

from __future__ import annotations

from toolservices.shell._result import (
    FileEntry,
    ShellArgumentError,
    ShellFileError,
    ShellResult,
)
from toolservices.shell._service import ShellService

__all__ = ["FileEntry", "ShellArgumentError", "ShellFileError", "ShellResult", "ShellService"]
