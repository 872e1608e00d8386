"""The typed result of one shell command, readable as the contract's dict."""

from __future__ import annotations

from dataclasses import dataclass

from toolservices.errors import ToolError, UserError
from toolservices.python import ResultMapping

__all__ = ["FileEntry", "ShellArgumentError", "ShellFileError", "ShellResult"]


@dataclass(frozen=True, kw_only=True, eq=False)
class ShellResult(ResultMapping):
    """Outcome of one command, a :class:`~collections.abc.Mapping` like ``ExecResult``.

    * ``success``: the command exited with status 0 (and did not time out).
    * ``returncode``: bash's exit status; ``-N`` when killed by signal N, -1 on timeout.
    * ``stdout`` / ``stderr``: decoded as UTF-8 with replacement, each cut at
      ``max_output`` bytes with a visible marker (``truncated`` then says so).
    * ``timed_out``: the time limit was hit and the command's process tree killed.
    * ``restarted``: the command's changes to the shell state (cwd, variables,
      functions) could not be saved (it timed out, ran ``exec``, killed its
      shell, or the session itself was lost): the next command starts from
      the state before this one, or from a fresh shell if the session was lost.
    """

    success: bool
    stdout: str
    stderr: str
    returncode: int
    duration: float = 0.0
    timed_out: bool = False
    truncated: bool = False
    restarted: bool = False
    session_id: str | None = None


@dataclass(frozen=True, kw_only=True, slots=True)
class FileEntry:
    """One entry of :meth:`ShellService.list_files`: ``kind`` is file, dir, symlink or other.

    ``name`` is always valid text (JSON-safe): a name whose bytes are not
    UTF-8 has them replaced by U+FFFD there, and its exact bytes in ``raw``
    (None for every valid name). ``os.fsdecode(raw)`` names it to the file tools.
    """

    name: str
    kind: str
    size: int
    raw: bytes | None = None


class ShellFileError(ToolError):
    """A file operation failed as the session's own commands would (the model can act on it).

    ``reason`` is the errno name (``ENOENT``, ``EACCES``, ``EISDIR``, ``ENOSPC``,
    ``EFBIG`` for a size cap...), ``path`` the path as given.
    """

    kind = "tool_failed"

    def __init__(self, op: str, path: str, reason: str, message: str) -> None:
        super().__init__(f"{op}: {path}: {message}")
        self.op = op
        self.path = path
        self.reason = reason
        self.detail = message

    def __reduce__(self) -> tuple[type[ShellFileError], tuple[str, str, str, str]]:
        # crosses process boundaries (a Ray actor's reply) with its fields intact
        return type(self), (self.op, self.path, self.reason, self.detail)


class ShellArgumentError(ShellFileError, UserError):
    """An argument no file name or text can be: a NUL, a lone surrogate, a path beyond
    ``PATH_MAX``. A :class:`~toolservices.errors.UserError` (the caller passed it) that is
    also a :class:`ShellFileError` (``reason`` EINVAL or ENAMETOOLONG), so that a model
    whose tool call chose it gets a tool error to act on, never a traceback."""
