"""Checks on the caller's side: arguments no file or text can be, and the supervisor's replies."""

from __future__ import annotations

from typing import Any

from toolservices.errors import InfrastructureError, UserError
from toolservices.python import ExecResult
from toolservices.shell._result import FileEntry, ShellArgumentError

__all__ = [
    "RUN_FIELDS",
    "check_path",
    "checked",
    "died",
    "encode",
    "entry",
    "largest_variable",
    "lone_surrogate",
]

#: what a command's reply holds (``ShellService._reply`` checks it)
RUN_FIELDS: dict[str, Any] = {
    "returncode": int,
    "timed_out": bool,
    "restarted": bool,
    "stdout": str,
    "stderr": str,
    "stdout_total": int,
    "stderr_total": int,
    "duration": int | float,
    "limit": int | float,
}


def largest_variable(state: str) -> tuple[str, int]:
    """The name and the size (characters of its ``declare`` line) of a state's largest
    variable, for the error saying why it cannot travel."""
    best, size = "?", 0
    for line in state.split("\n"):
        if line.startswith("declare ") and len(line) > size:
            words = line.split(" ", 2)
            best, size = (words[2].split("=", 1)[0] if len(words) == 3 else "?"), len(line)
    return best, size


def entry(name: str, kind: str, size: int) -> FileEntry:
    """A listed name as valid text, its bytes in ``raw`` when they are not UTF-8."""
    raw = name.encode("utf-8", "surrogateescape")  # the session's os.fsdecode'd bytes
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError:
        return FileEntry(name=raw.decode("utf-8", "replace"), kind=kind, size=size, raw=raw)
    return FileEntry(name=name, kind=kind, size=size)


def died(res: ExecResult) -> bool:
    """The session's interpreter (the supervisor) died during the call (OOM, killed)."""
    return res.exception is not None and res.exception.type == "InterpreterExit"


def checked(reply: dict[str, Any], fields: dict[str, Any]) -> dict[str, Any]:
    """``reply`` if each of ``fields`` is there with its type, else an InfrastructureError."""
    for name, kind in fields.items():
        value = reply.get(name)
        if not isinstance(value, kind) or (isinstance(value, bool) and kind is int):
            raise InfrastructureError(
                f"the shell session's supervisor sent a malformed reply ({name!r})", retryable=True
            )
    return reply


#: the longest path Linux takes (PATH_MAX, its final NUL included)
_PATH_MAX = 4096


def lone_surrogate(text: str) -> str:
    """Why ``text`` is no text (a lone surrogate that is not an ``os.fsdecode`` escape), or ""."""
    try:
        text.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError as exc:
        return f"a lone surrogate {text[exc.start]!r} at index {exc.start}, which is no text"
    return ""


def encode(text: str, op: str, what: str) -> bytes:
    """``text`` as bytes: UTF-8, with ``\\udc80``-``\\udcff`` as the raw bytes they stand
    for (``os.fsdecode``'s escapes, as ``FileEntry.raw`` names come back)."""
    why = lone_surrogate(text)
    if why:
        raise ShellArgumentError(op, what, "EINVAL", f"holds {why}; pass valid text or bytes")
    return text.encode("utf-8", "surrogateescape")


def check_path(value: object, op: str) -> str:
    if not isinstance(value, str) or not value:
        raise UserError(f"path must be a non-empty str, got {value!r}")
    if "\x00" in value:
        raise ShellArgumentError(op, value, "EINVAL", "a path cannot contain a NUL character")
    size = len(encode(value, op, value))
    if size >= _PATH_MAX:
        raise ShellArgumentError(
            op,
            value[:80] + "...",
            "ENAMETOOLONG",
            f"the path is {size} bytes long; Linux takes paths of at most {_PATH_MAX - 1}",
        )
    return value
