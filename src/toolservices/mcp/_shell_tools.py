"""The shell tools (``bash``, ``read_file``, ``write_file``, ``str_replace``) as MCP tools.

``serve --mcp --shell`` offers them beside ``python_execute``. Shell sessions
are scoped, limited and expired exactly like Python sessions (see
:mod:`toolservices.mcp._python_tools`): a client's ``session_id`` names a
session of its own MCP connection (or, with ``--session-scope namespace``,
of its token's namespace); a call without one runs in a fresh session
closed right after it. The tools return the same text a model reads from
the tools of an :class:`~toolservices.Episode`. With ``--shell-python``,
``python_execute`` runs in the shell sessions too (``ShellService.arun_python``):
one environment for both, closed with ``shell_close_session``.
"""

from __future__ import annotations

import base64
import binascii
import uuid
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from typing import Any, Literal

import anyio

from toolservices.env import MODEL_OUTPUT, ShellTool, shell_tools
from toolservices.errors import ToolError
from toolservices.mcp._python_tools import PythonSessions, python_execute_tool
from toolservices.tools import FunctionTool, Tool

__all__ = ["SHELL_PYTHON", "ShellExtension", "ShellSessions", "mcp_shell_tools", "shell_extension"]

#: ``python_execute``'s description when it runs in the shell session (``--shell-python``)
SHELL_PYTHON = (
    "Run Python code in the sandboxed shell session's own interpreter; return success, "
    "stdout and stderr.\n\nWith a session_id, the code runs beside bash in that session: "
    "the same files, working directory, /tmp and network, and variables and imports are "
    "kept between calls; without one, it runs in a fresh session."
)


class ShellSessions(PythonSessions):
    """A ShellService's sessions, scoped and limited as :class:`PythonSessions` are.

    Inherits the scoping (``_key``), ``close``, ``release`` and
    ``expire_idle``; :meth:`call` runs a shell tool, and ``execute`` (the
    ``python_execute`` of ``--shell-python``) runs Python in the shell session.
    """

    kind = "shell"
    close_tool = "shell_close_session"
    expiry_loses = "earlier files, shell state and Python variables"

    async def run_python(self, code: str, session_id: str | None) -> Any:
        """The interpreter of shell session ``session_id`` (a fresh session without one)."""
        return await self.executor.arun_python(code, session_id=session_id)

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
            kind=self.kind,
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


def mcp_shell_tools(
    shell: Any, *, sessions: ShellSessions | None = None, max_output: int | None = MODEL_OUTPUT
) -> list[Tool]:
    """``bash``, ``read_file``, ``write_file``, ``str_replace`` and
    ``shell_close_session`` over a ShellService, each taking an optional ``session_id``.

    ``max_output``: bytes of a command's output a client reads (see
    :func:`~toolservices.env.bash_tool`).
    """
    scoped = sessions if sessions is not None else ShellSessions(shell)
    tools = {t.name: t for t in shell_tools(shell, max_output=max_output)}

    def runner(name: str, args: dict[str, Any]) -> Callable[[str], Awaitable[str]]:
        tool: ShellTool = tools[name]
        return lambda session: tool.run(session, **{k: v for k, v in args.items() if v is not None})

    async def bash(
        command: str,
        session_id: str | None = None,
        timeout: float | None = None,  # noqa: ASYNC109 - the command's limit, the model's to lower
    ) -> str:
        """Run one bash command in a sandboxed shell; returns stdout, stderr and the exit status.

        stdin is closed: do not start interactive programs. Long output is cut
        to its head and tail. The sandbox has no network unless the server
        enabled it.

        Args:
            command: The bash command to run.
            session_id: Keep the working directory, variables and files between calls by
                giving the same id; without one the command runs in a fresh shell.
            timeout: Seconds before the command is killed; at most the server's --timeout
                (the default).
        """
        args = {"command": command, "timeout": timeout}
        return await scoped.call(session_id, runner("bash", args))

    async def read_file(
        path: str,
        session_id: str | None = None,
        start_line: int | None = None,
        end_line: int | None = None,
    ) -> str:
        """Show a text file of the session's workspace with line numbers, or a directory's entries.

        A binary file is named (type and size), not shown.

        Args:
            path: File or directory; relative paths are in the session's workspace.
            session_id: The session whose files to read (as given to bash).
            start_line: First line to show (1-based).
            end_line: Last line to show (inclusive); -1 or omitted: to the end.
        """
        args = {"path": path, "start_line": start_line, "end_line": end_line}
        return await scoped.call(session_id, runner("read_file", args))

    async def write_file(
        path: str,
        content: str,
        session_id: str | None = None,
        encoding: Literal["text", "base64"] = "text",
    ) -> str:
        """Create or overwrite a file in the session's workspace.

        Args:
            path: The file to write; relative paths are in the session's workspace.
            content: The file's whole new content: text, or base64 of the bytes with
                encoding "base64" (for binary files).
            session_id: The session whose files to write (as given to bash).
            encoding: "text" (the default) or "base64".
        """
        if encoding == "text":
            return await scoped.call(
                session_id, runner("write_file", {"path": path, "content": content})
            )
        try:
            data = base64.b64decode(content, validate=True)
        except binascii.Error as exc:
            raise ToolError(f"content is not valid base64 ({exc}); nothing was written") from exc

        async def write(session: str) -> str:
            await shell.awrite_file(path, data, session_id=session)
            return f"Wrote {len(data)} bytes to {path}"

        return await scoped.call(session_id, write)

    async def str_replace(
        path: str, old_str: str, new_str: str, session_id: str | None = None
    ) -> str:
        """Replace old_str, which must occur exactly once in the file, with new_str.

        Args:
            path: The file to edit; relative paths are in the session's workspace.
            old_str: The exact text to replace (same characters, whitespace and
                indentation); include surrounding lines to make it unique.
            new_str: The text to put in its place.
            session_id: The session whose files to edit (as given to bash).
        """
        args = {"path": path, "old_str": old_str, "new_str": new_str}
        return await scoped.call(session_id, runner("str_replace", args))

    async def shell_close_session(session_id: str) -> str:
        """Close a shell session: end its processes and delete its files.

        Args:
            session_id: The session to close.
        """
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
        self, python: Callable[[str], Awaitable[None]] | None
    ) -> Callable[[str], Coroutine[Any, Any, None]]:
        """``python``'s disconnect handler (None: no Python sessions of their own), then the
        shell sessions' release."""

        async def release(connection: str) -> None:
            try:
                if python is not None:
                    await python(connection)
            finally:
                await self.sessions.release(connection)

        return release

    def background(
        self, python: Callable[[], Coroutine[Any, Any, None]] | None
    ) -> Callable[[], Coroutine[Any, Any, None]]:
        """``python``'s background task (None: none) and the shell sessions' expiry, together."""

        async def both() -> None:
            async with anyio.create_task_group() as tg:
                if python is not None:
                    tg.start_soon(python)
                tg.start_soon(self.sessions.expire_idle)

        return both


def shell_extension(
    *,
    pool_size: int,
    timeout: float,
    max_output: int | None = MODEL_OUTPUT,
    max_sessions: int,
    idle_timeout: float | None,
    scope: Any,
    python: bool = False,
) -> ShellExtension:
    """A ShellService and its MCP tools, configured as the server's Python tools are;
    ``python``: with ``python_execute`` running in the caller's shell session."""
    from toolservices.shell import ShellService

    shell = ShellService(
        pool_size=pool_size, timeout=timeout, max_sessions=max(max_sessions, pool_size)
    )
    sessions = ShellSessions(
        shell, max_sessions=max_sessions, idle_timeout=idle_timeout, scope=scope
    )
    tools = mcp_shell_tools(shell, sessions=sessions, max_output=max_output)
    if python:
        tools.insert(0, python_execute_tool(sessions, description=SHELL_PYTHON))
    return ShellExtension(shell=shell, sessions=sessions, tools=tools)
