"""The typed result of one execution, readable as the contract's dict."""

from __future__ import annotations

import functools
from collections.abc import Iterator, Mapping
from dataclasses import asdict, dataclass, fields
from typing import Any

__all__ = ["ExceptionInfo", "ExecResult", "ResultMapping"]


@functools.cache
def _keys(cls: type) -> tuple[str, ...]:
    return tuple(f.name for f in fields(cls))


class ResultMapping(Mapping[str, Any]):
    """A frozen dataclass result read as the contract's dict: its fields are the keys.

    Shared by :class:`ExecResult` and the shell's ``ShellResult``, so code written
    for a plain dict (``result["success"]``) works on both. Subclasses are
    ``@dataclass(frozen=True, kw_only=True, eq=False)`` with a ``restarted`` field;
    :meth:`_plain` turns a field's value into what the dict holds.
    """

    restarted: bool

    @property
    def state_lost(self) -> bool:
        """Alias of :attr:`restarted`, named for what it means to the caller."""
        return self.restarted

    def _plain(self, value: Any) -> Any:
        return value

    def __getitem__(self, key: str) -> Any:
        if key not in _keys(type(self)):
            raise KeyError(key)
        return self._plain(getattr(self, key))

    def __iter__(self) -> Iterator[str]:
        return iter(_keys(type(self)))

    def __len__(self) -> int:
        return len(_keys(type(self)))

    def __repr__(self) -> str:
        shown = ", ".join(f"{k}={getattr(self, k)!r}" for k in _keys(type(self)))
        return f"{type(self).__name__}({shown})"

    def to_dict(self) -> dict[str, Any]:
        """A plain dict (JSON-serialisable) with every field."""
        return {key: self[key] for key in _keys(type(self))}


@dataclass(frozen=True, kw_only=True, slots=True)
class ExceptionInfo:
    """What the code raised: ``type`` is the qualified class name."""

    type: str
    message: str


@dataclass(frozen=True, kw_only=True, eq=False)
class ExecResult(ResultMapping):
    """Outcome of running one snippet.

    A :class:`~collections.abc.Mapping`, so code written for the contract's
    dict (``result["success"]``, ``result["stdout"]``...) keeps working.

    * ``success``: the code ran to the end without raising (warnings printed
      on stderr do not count) and the interpreter exited with status 0 if it
      exited at all.
    * ``returncode``: 0 on success, 1 for an exception, the ``sys.exit`` /
      ``os._exit`` status, ``-N`` when killed by signal N, -1 on timeout.
    * ``exception``: type and message of what was raised (the full traceback
      is at the end of ``stderr``), or a ``TimeoutError`` for a timeout.
    * ``timed_out``: the wall-clock limit was hit and the process tree killed.
    * ``truncated``: stdout or stderr exceeded the size limit and was cut
      (the cut is marked in the text).
    * ``restarted``: the session's interpreter is not the one that held its
      earlier state: it died or was killed during this call, or had been
      evicted or broken before it. Variables defined earlier are gone.
    """

    success: bool
    stdout: str
    stderr: str
    returncode: int
    exception: ExceptionInfo | None = None
    duration: float = 0.0
    timed_out: bool = False
    truncated: bool = False
    restarted: bool = False
    session_id: str | None = None

    def _plain(self, value: Any) -> Any:
        return asdict(value) if isinstance(value, ExceptionInfo) else value
