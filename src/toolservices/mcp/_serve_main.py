"""The ``toolservices serve --mcp`` entry point: the Python tools (and, asked for, the
shell tools) served with their sessions, tokens and signal handling."""

from __future__ import annotations

import logging
import signal
import sys
import threading
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from types import FrameType
from typing import Any

from toolservices.env import MODEL_OUTPUT
from toolservices.errors import UserError
from toolservices.mcp._auth import TOKENS_ENV, Tokens, load_tokens
from toolservices.mcp._python_tools import (
    DEFAULT_MAX_SESSIONS,
    PythonSessions,
    SessionScope,
    python_tools,
)
from toolservices.mcp._server import (
    DEFAULT_MAX_REQUEST_BYTES,
    DEFAULT_SESSION_IDLE_TIMEOUT,
    DEFAULT_SHUTDOWN_GRACE,
    Transport,
    _announce,
    serve,
)

__all__ = ["serve_main"]

logger = logging.getLogger(__name__)


class _Terminated(BaseException):
    """SIGTERM before the server took over the signals (startup)."""


def serve_main(
    *,
    transport: Transport = "stdio",
    host: str = "127.0.0.1",
    port: int = 8765,
    path: str = "/mcp",
    pool_size: int = 4,
    timeout: float = 10.0,
    max_sessions: int = DEFAULT_MAX_SESSIONS,
    session_idle_timeout: float | None = DEFAULT_SESSION_IDLE_TIMEOUT,
    max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES,
    shutdown_grace: float = DEFAULT_SHUTDOWN_GRACE,
    session_scope: SessionScope = "connection",
    tokens: Sequence[str] = (),
    tokens_file: str | None = None,
    shell: bool = False,
    shell_python: bool = False,
    max_output: int | None = MODEL_OUTPUT,
) -> int:
    """``toolservices serve --mcp``: the sandboxed Python executor as an MCP server.

    Serves until the client disconnects (stdio) or SIGINT/SIGTERM (drained,
    see :func:`~toolservices.mcp.aserve`); the executor's interpreters are shut
    down on the way out. ``session_scope="namespace"`` (HTTP only) keys Python
    sessions by the caller's bearer token, from ``tokens``, ``tokens_file`` and
    ``$TOOLSERVICES_MCP_TOKENS``; any token configured makes every HTTP request
    need one. ``shell=True`` also serves the shell tools (``bash``, ``read_file``,
    ``write_file``, ``str_replace``, ``shell_close_session``; sessions scoped and
    limited the same way, see :mod:`toolservices.mcp._shell_tools`), ``bash``'s
    output cut to ``max_output`` bytes (head and tail). ``shell_python=True``
    (with ``shell``): ``python_execute`` runs in the caller's shell session,
    beside ``bash`` (one environment; no ``python_close_session``, no
    sessions of the Python executor). Returns the exit status (0; 2 for a
    bad configuration, said on stderr).
    """
    from toolservices.python import PythonExecutorService

    try:
        checked = _check_tokens(transport, session_scope, tokens, tokens_file)
        if shell_python and not shell:
            raise UserError("--shell-python needs --shell (Python runs in the shell sessions)")
    except UserError as exc:
        print(f"toolservices serve: {exc}", file=sys.stderr)
        return 2

    executor = None
    tools = []
    on_disconnect: Callable[[str], Awaitable[None]] | None = None
    background: Callable[[], Coroutine[Any, Any, None]] | None = None
    if not shell_python:
        executor = PythonExecutorService(
            pool_size=pool_size, timeout=timeout, max_sessions=max(max_sessions, pool_size)
        )
        sessions = PythonSessions(
            executor,
            max_sessions=max_sessions,
            idle_timeout=session_idle_timeout,
            scope=session_scope,
        )
        tools = python_tools(executor, sessions=sessions)
        on_disconnect, background = sessions.release, sessions.expire_idle
    extension = None
    if shell:
        from toolservices.mcp._shell_tools import shell_extension

        extension = shell_extension(
            pool_size=pool_size,
            timeout=timeout,
            max_output=max_output,
            max_sessions=max_sessions,
            idle_timeout=session_idle_timeout,
            scope=session_scope,
            python=shell_python,
        )
        tools += extension.tools
        on_disconnect = extension.on_disconnect(on_disconnect)
        background = extension.background(background)
    main = threading.current_thread() is threading.main_thread()
    previous: dict[int, Any] = {}
    if main:
        # Until aserve owns the signals (and after): unwind through the finally
        # below; the interpreters live in their own process groups and would
        # outlive a default-handled SIGTERM.
        previous[signal.SIGTERM] = signal.signal(signal.SIGTERM, _terminate)
    try:
        serve(
            tools,
            transport=transport,
            host=host,
            port=port,
            path=path,
            on_ready=_announce,
            max_request_bytes=max_request_bytes,
            session_idle_timeout=session_idle_timeout,
            shutdown_grace=shutdown_grace,
            on_disconnect=on_disconnect,
            background=background,
            tokens=checked,
        )
    except (KeyboardInterrupt, _Terminated):
        logger.info("interrupted")
    finally:
        if main:  # closing is bounded; a repeated signal must not cut it short
            for sig in (signal.SIGINT, signal.SIGTERM):
                previous.setdefault(sig, signal.getsignal(sig))
                signal.signal(sig, signal.SIG_IGN)
        try:
            try:
                if executor is not None:
                    executor.close()
            finally:
                if extension is not None:
                    extension.shell.close()
        finally:
            for signum, handler in previous.items():
                signal.signal(signum, handler)
    return 0


def _check_tokens(
    transport: Transport,
    scope: SessionScope,
    tokens: Sequence[str],
    tokens_file: str | None,
) -> list[str] | None:
    """The tokens the server checks (``None``: none), or a UserError saying what is wrong."""
    if scope not in ("connection", "namespace"):
        raise UserError(f"Unknown session scope {scope!r}; valid: 'connection', 'namespace'")
    found = load_tokens(tokens, tokens_file=tokens_file)
    if transport != "http":
        if scope == "namespace" or tokens or tokens_file is not None:
            raise UserError(
                "--session-scope namespace and tokens need --transport http "
                "(a stdio server has one client: the process that started it)"
            )
        return None  # $TOOLSERVICES_MCP_TOKENS is for HTTP servers
    if scope == "namespace" and not found:
        raise UserError(
            f"--session-scope namespace needs tokens: --token, --tokens-file or ${TOKENS_ENV}"
        )
    if found:
        Tokens(found)  # checked now, so a bad token is said before serving
        return found
    return None


def _terminate(signum: int, frame: FrameType | None) -> None:
    raise _Terminated
