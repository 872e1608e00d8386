"""The sandboxed Python executor as MCP-servable tools.

Python sessions belong to the MCP connection that opened them: two clients
that both say ``session_id="a"`` get two interpreters, and neither can close
the other's. A connection's sessions are closed when it ends (HTTP: the
client's DELETE; stdio: the process exits with its client), a session
unused for ``idle_timeout`` seconds is closed (this also covers clients
that vanish without a word), and at most ``max_sessions`` are open at
once (beyond that a call is refused with a message the model can act on;
nothing is evicted behind a client's back).

With ``scope="namespace"`` (HTTP with bearer tokens) sessions belong to the
namespace the caller's token proves instead: every connection presenting
that token (and sub-namespace) reaches them, no other token does, and they
end on idle timeout or ``python_close_session``, not when a connection ends
(a client that reconnects for every call keeps its state).
"""

from __future__ import annotations

import logging
import math
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from typing import Any, Literal, TypeVar

import anyio

from toolservices.env import PythonTool
from toolservices.errors import ToolError, UserError
from toolservices.mcp._server import (
    DEFAULT_SESSION_IDLE_TIMEOUT,
    current_connection,
    current_namespace,
)
from toolservices.tools import FunctionTool, Tool

__all__ = [
    "DEFAULT_MAX_SESSIONS",
    "PythonSessions",
    "SessionScope",
    "python_execute_tool",
    "python_tools",
]

logger = logging.getLogger(__name__)

#: Default of ``max_sessions``: Python sessions open at once, over all clients.
DEFAULT_MAX_SESSIONS = 64
#: How many idle-expired sessions are remembered (their next call says the state is gone).
EXPIRED_MEMORY = 4096

_Key = tuple[str, str]  # (MCP connection or "ns:" namespace, the client's session_id)
SessionScope = Literal["connection", "namespace"]
_T = TypeVar("_T")


class PythonSessions:
    """The executor's sessions, scoped to MCP connections or token namespaces
    (see the module docstring)."""

    def __init__(
        self,
        executor: Any,
        *,
        max_sessions: int = DEFAULT_MAX_SESSIONS,
        idle_timeout: float | None = DEFAULT_SESSION_IDLE_TIMEOUT,
        scope: SessionScope = "connection",
    ) -> None:
        if scope not in ("connection", "namespace"):
            raise UserError(f"Unknown session scope {scope!r}; valid: 'connection', 'namespace'")
        if max_sessions < 1:
            raise UserError(f"max_sessions must be at least 1, got {max_sessions}")
        if idle_timeout is not None and not 0 < idle_timeout < math.inf:
            raise UserError(f"idle_timeout must be positive or None, got {idle_timeout}")
        self.executor = executor
        self.max_sessions = max_sessions
        self.idle_timeout = idle_timeout
        self.scope = scope
        self._last_used: dict[_Key, float] = {}  # open sessions (loop time of their last call)
        self._busy: dict[_Key, int] = {}  # calls running per session: never expired meanwhile
        self._expired: OrderedDict[_Key, None] = OrderedDict()

    def __len__(self) -> int:
        return len(self._last_used)

    async def aexecute(self, code: str, *, session_id: str | None = None) -> dict[str, Any]:
        """:meth:`execute` as the python tool calls every executor."""
        return await self.execute(code, session_id)

    #: what the model is told a session is, the tool that closes one, what an expiry loses
    kind = "Python"
    close_tool = "python_close_session"
    expiry_loses = "earlier variables and imports"

    async def execute(self, code: str, session_id: str | None) -> dict[str, Any]:
        """Run ``code`` in the caller's session ``session_id`` (or a fresh interpreter)."""
        if session_id is None:
            return dict(await self.run_python(code, None))
        result, expired = await self.in_session(
            session_id,
            lambda executor_id: self.run_python(code, executor_id),
            kind=self.kind,
            hint=f"Close a session you no longer need with {self.close_tool}, or call "
            "python_execute without a session_id for a one-off run.",
        )
        data = dict(result)  # ExecResult is a JSON-ready Mapping
        data["session_id"] = session_id
        if expired:
            data["restarted"] = True
            data["notice"] = (
                f"{self.kind} session {session_id!r} was closed after {self.idle_timeout:g} s "
                f"without calls; this call ran in a new interpreter ({self.expiry_loses} "
                "are gone)."
            )
        return data

    async def run_python(self, code: str, session_id: str | None) -> Any:
        """The executor's call in its session ``session_id`` (``ShellSessions``: the
        interpreter of that shell session)."""
        return await self.executor.aexecute(code, session_id=session_id)

    async def in_session(
        self, session_id: str, run: Callable[[str], Awaitable[_T]], *, kind: str, hint: str
    ) -> tuple[_T, bool]:
        """``run(<the executor's session id>)`` in the caller's session ``session_id``.

        Returns its value and whether an idle expiry had closed the session
        since the caller's last call (the caller tells the model). A new
        session beyond ``max_sessions`` is refused with ``hint``.
        """
        key = self._key(session_id)
        if key not in self._last_used:
            if len(self._last_used) >= self.max_sessions:
                raise ToolError(
                    f"Too many {kind} sessions are open (the limit is {self.max_sessions}); "
                    f"session {session_id!r} was not started. {hint}"
                )
            self._last_used[key] = anyio.current_time()
        self._busy[key] = self._busy.get(key, 0) + 1
        try:
            value = await run(_executor_id(key))
        finally:
            self._busy[key] -= 1
            if not self._busy[key]:
                del self._busy[key]
            if key in self._last_used:  # unless closed meanwhile
                self._last_used[key] = anyio.current_time()
        expired = key in self._expired
        if expired:
            del self._expired[key]
        return value, expired

    async def close(self, session_id: str) -> bool:
        """Close the caller's session ``session_id``; whether it was open."""
        key = self._key(session_id)
        self._expired.pop(key, None)
        if self._last_used.pop(key, None) is None:
            return False
        await self.executor.aclose_session(_executor_id(key))
        return True

    def _key(self, session_id: str) -> _Key:
        if self.scope == "namespace":
            namespace = current_namespace()
            if namespace is None:
                raise ToolError(
                    "session_id needs a namespace, and this request proved none "
                    "(the server is not checking bearer tokens)."
                )
            return f"ns:{namespace}", str(session_id)
        connection = current_connection()
        if connection is None:
            raise ToolError(
                "session_id needs an MCP session, and this request came without one "
                "(stateless HTTP): call python_execute without a session_id."
            )
        return connection, str(session_id)

    async def release(self, connection: str) -> None:
        """Close every session of ``connection`` (its client has gone); namespace
        sessions outlive connections (they end on idle timeout)."""
        if self.scope == "namespace":
            return
        keys = [key for key in self._last_used if key[0] == connection]
        for key in [k for k in self._expired if k[0] == connection]:
            del self._expired[key]
        for key in keys:
            del self._last_used[key]
        if keys:
            logger.info("closing %d Python session(s) of ended MCP session", len(keys))
        async with anyio.create_task_group() as tg:
            for key in keys:
                tg.start_soon(self._close_quietly, key)

    async def _close_quietly(self, key: _Key) -> None:
        """Close one executor session; a failure is logged (the server serves on)."""
        try:
            await self.executor.aclose_session(_executor_id(key))
        except Exception:  # an executor failing to close must not take the server down
            logger.exception("closing a Python session failed")

    async def expire_idle(self) -> None:
        """Close sessions idle for ``idle_timeout`` seconds, forever (run it in the background)."""
        if self.idle_timeout is None:
            await anyio.sleep_forever()
            return
        limit = self.idle_timeout
        while True:
            now = anyio.current_time()
            due = [
                key
                for key, used in self._last_used.items()
                if key not in self._busy and now - used >= limit
            ]
            for key in due:
                del self._last_used[key]
                self._expired[key] = None
                while len(self._expired) > EXPIRED_MEMORY:
                    self._expired.popitem(last=False)
                await self._close_quietly(key)
            # The next expiry can be no earlier than the oldest idle session's; a
            # session opened or used from now on expires later than now + limit.
            idle = [used for key, used in self._last_used.items() if key not in self._busy]
            await anyio.sleep(max(0.0, min(idle, default=now) + limit - anyio.current_time()))


def _executor_id(key: _Key) -> str:
    # MCP session ids and namespaces are visible ASCII without "/": the split is unambiguous.
    return f"{key[0]}/{key[1]}"


def python_tools(executor: Any, *, sessions: PythonSessions | None = None) -> list[Tool]:
    """``python_execute`` and ``python_close_session`` tools over a PythonExecutorService.

    ``sessions`` scopes and limits the sessions (a default :class:`PythonSessions`).
    """
    scoped = sessions if sessions is not None else PythonSessions(executor)
    python_execute = python_execute_tool(
        scoped,
        description="Run Python code in a sandboxed interpreter; return success, stdout and "
        "stderr.\n\nGive the same session_id on later calls to keep variables and imports "
        "between them; without one, the code runs in a fresh interpreter.",
    )

    async def python_close_session(session_id: str) -> str:
        """Close a Python session and free its interpreter (its variables are lost).

        Args:
            session_id: The session to close.
        """
        if await scoped.close(session_id):
            return f"Session {session_id} closed"
        return f"Session {session_id} was not open (nothing to close)"

    return [python_execute, FunctionTool(python_close_session)]


def python_execute_tool(sessions: PythonSessions, *, description: str) -> Tool:
    """``python_execute`` in ``sessions``: the library's one Python tool, the whole result,
    in the session the model names."""
    return PythonTool(
        sessions,
        name="python_execute",
        description=description,
        render="result",
        session=None,
    )
