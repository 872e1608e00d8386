"""The shell tools (``bash``, ``read_file``, ``write_file``, ``str_replace``) as MCP tools.

``serve --mcp --shell`` offers them beside ``python_execute``. Shell sessions
are scoped, limited and expired exactly like Python sessions (see
:mod:`toolservices.mcp._python_tools`): a client's ``session_id`` names a
session of its own MCP connection (or, with ``--session-scope namespace``,
of its token's namespace); a call without one runs in a fresh session
closed right after it. The tools return the same text a model reads from
the tools of an :class:`~toolservices.Episode`.
"""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from typing import Any

import anyio

from toolservices.env import ShellTool, shell_tools
from toolservices.mcp._python_tools import PythonSessions
from toolservices.tools import FunctionTool, Tool

__all__ = ["ShellExtension", "ShellSessions", "mcp_shell_tools", "shell_extension"]


class ShellSessions(PythonSessions):
    """A ShellService's sessions, scoped and limited as :class:`PythonSessions` are.

    Inherits the scoping (``_key``), ``close``, ``release`` and
    ``expire_idle``; :meth:`call` replaces ``execute`` (which runs Python).
    """

    async def call(self, session_id: str | None, run: Callable[[str], Awaitable[str]]) -> str:
        """``run(<the service's session id>)`` in the caller's session ``session_id``.

        Without ``session_id``: in a fresh session closed right after.
        """
        if session_id is None:
            one_off = f"mcp-call-{uuid.uuid4().hex[:16]}"
            try:
                return await run(one_off)
            finally:
                with anyio.CancelScope(shield=True):
                    await self.executor.aclose_session(one_off)
        text, expired = await self.in_session(
            session_id,
            run,
            kind="shell",
            hint="Close a session you no longer need with shell_close_session, or call "
            "without a session_id for a one-off command.",
        )
        if expired:
            text = (
                f"[shell session {session_id!r} was closed after {self.idle_timeout:g} s "
                "without calls; this call ran in a new session: earlier files and shell "
                "state are gone]\n" + text
            )
        return text


def mcp_shell_tools(shell: Any, *, sessions: ShellSessions | None = None) -> list[Tool]:
    """``bash``, ``read_file``, ``write_file``, ``str_replace`` and
    ``shell_close_session`` over a ShellService, each taking an optional ``session_id``."""
    scoped = sessions if sessions is not None else ShellSessions(shell)
    tools = {t.name: t for t in shell_tools(shell)}

    def runner(name: str, args: dict[str, Any]) -> Callable[[str], Awaitable[str]]:
        tool: ShellTool = tools[name]
        return lambda session: tool.run(session, **{k: v for k, v in args.items() if v is not None})

    async def bash(command: str, session_id: str | None = None) -> str:
        """Run one bash command in a sandboxed shell; returns stdout, stderr and the exit status.

        Give the same session_id on later calls to keep the working directory,
        exported variables and files; without one the command runs in a fresh
        shell. stdin is closed: do not start interactive programs.
        """
        return await scoped.call(session_id, runner("bash", {"command": command}))

    async def read_file(
        path: str,
        session_id: str | None = None,
        start_line: int | None = None,
        end_line: int | None = None,
    ) -> str:
        """Show a text file of the session's workspace with line numbers (or a directory's
        entries); start_line and end_line (1-based, inclusive) choose a range."""
        args = {"path": path, "start_line": start_line, "end_line": end_line}
        return await scoped.call(session_id, runner("read_file", args))

    async def write_file(path: str, content: str, session_id: str | None = None) -> str:
        """Create or overwrite a text file in the session's workspace."""
        return await scoped.call(
            session_id, runner("write_file", {"path": path, "content": content})
        )

    async def str_replace(
        path: str, old_str: str, new_str: str, session_id: str | None = None
    ) -> str:
        """Replace old_str, which must occur exactly once in the file (same characters,
        whitespace and indentation), with new_str."""
        args = {"path": path, "old_str": old_str, "new_str": new_str}
        return await scoped.call(session_id, runner("str_replace", args))

    async def shell_close_session(session_id: str) -> str:
        """Close a shell session: end its processes and delete its files."""
        if await scoped.close(session_id):
            return f"Session {session_id} closed"
        return f"Session {session_id} was not open (nothing to close)"

    functions = (bash, read_file, write_file, str_replace, shell_close_session)
    return [FunctionTool(fn) for fn in functions]


@dataclass(frozen=True, kw_only=True)
class ShellExtension:
    """What ``serve_main`` adds for ``--shell``: the tools and their session housekeeping."""

    shell: Any
    sessions: ShellSessions
    tools: list[Tool]

    def on_disconnect(
        self, python: Callable[[str], Awaitable[None]]
    ) -> Callable[[str], Coroutine[Any, Any, None]]:
        """``python``'s disconnect handler, then the shell sessions' release."""

        async def release(connection: str) -> None:
            try:
                await python(connection)
            finally:
                await self.sessions.release(connection)

        return release

    def background(
        self, python: Callable[[], Coroutine[Any, Any, None]]
    ) -> Callable[[], Coroutine[Any, Any, None]]:
        """``python``'s background task and the shell sessions' expiry, together."""

        async def both() -> None:
            async with anyio.create_task_group() as tg:
                tg.start_soon(python)
                tg.start_soon(self.sessions.expire_idle)

        return both


def shell_extension(
    *,
    pool_size: int,
    timeout: float,
    max_sessions: int,
    idle_timeout: float | None,
    scope: Any,
) -> ShellExtension:
    """A ShellService and its MCP tools, configured as the server's Python tools are."""
    from toolservices.shell import ShellService

    shell = ShellService(
        pool_size=pool_size, timeout=timeout, max_sessions=max(max_sessions, pool_size)
    )
    sessions = ShellSessions(
        shell, max_sessions=max_sessions, idle_timeout=idle_timeout, scope=scope
    )
    return ShellExtension(
        shell=shell, sessions=sessions, tools=mcp_shell_tools(shell, sessions=sessions)
    )
