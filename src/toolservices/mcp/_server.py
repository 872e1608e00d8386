"""The other direction: a ToolRegistry served as an MCP server (stdio or streamable HTTP).

Tools keep their names, descriptions and JSON Schemas. A tool's failure
(bad arguments, an exception, a timeout) becomes an ``isError`` result the
client's model can read; an unknown tool name is the JSON-RPC ``-32602``
error both MCP spec revisions ask for. Every string of every answer is valid
Unicode (lone surrogates are escaped): one bad string must not break the wire.

Shutdown (SIGINT/SIGTERM, or cancelling :func:`aserve`) is a drain: new calls
are refused, calls in flight get ``shutdown_grace`` seconds to finish and are
then cancelled with an ``isError`` result, every call received is answered,
and only then does the transport close.
"""

from __future__ import annotations

import functools
import math
import signal
import sys
import threading
from collections.abc import Awaitable, Callable, Coroutine, Iterable, Mapping
from typing import Any, Literal, ParamSpec

import anyio
import mcp.types as mt
from mcp import MCPError
from mcp.server.context import ServerRequestContext
from mcp.server.lowlevel import Server

from toolservices.dispatch import Dispatcher
from toolservices.env import SHELL_TOOL_NAMES as _SHELL_TOOLS
from toolservices.errors import UserError
from toolservices.mcp._config import IMPLEMENTATION_NAME, library_version
from toolservices.mcp._content import to_blocks
from toolservices.mcp._result import escape_result, escape_text
from toolservices.mcp._serving import (
    _CONNECTION,
    _NAMESPACE,
    NAMESPACE_SCOPE_KEY,
    _Calls,
    current_connection,
    current_namespace,
)
from toolservices.parsing.base import ToolCall
from toolservices.tools import Tool, ToolRegistry

__all__ = ["aserve", "build_server", "current_connection", "current_namespace", "serve"]

#: The tools ``--shell`` adds: asking for one without it gets a hint.
SHELL_TOOL_NAMES = frozenset({*_SHELL_TOOLS, "shell_close_session"})

Transport = Literal["stdio", "http"]
P = ParamSpec("P")

#: Default of ``max_request_bytes``: the MCP SDK's own limit of an HTTP request body.
DEFAULT_MAX_REQUEST_BYTES = 4 * 1024 * 1024
#: Default of ``session_idle_timeout``: the MCP SDK's idle limit of an HTTP session.
DEFAULT_SESSION_IDLE_TIMEOUT = 1800.0
#: Default of ``resume_buffer_bytes``: memory for the events a reconnecting HTTP client may
#: have missed (results of calls whose event stream dropped), over all sessions.
DEFAULT_RESUME_BUFFER_BYTES = 32 * 1024 * 1024
#: Default of ``shutdown_grace``: how long calls in flight may finish after SIGINT/SIGTERM.
DEFAULT_SHUTDOWN_GRACE = 5.0
#: What a call cancelled by a shutdown answers.
SHUTDOWN_CANCELLED = (
    "The server shut down before this call finished; it was cancelled "
    "(anything it did before that may have happened)."
)
#: What a call that arrives during a shutdown answers.
SHUTDOWN_REFUSED = "The server is shutting down; the call was not run."


def build_server(
    tools: ToolRegistry | Iterable[Any],
    *,
    name: str = IMPLEMENTATION_NAME,
    version: str | None = None,
    tool_timeout: float | None = None,
) -> Server[Any]:
    """An MCP server (the SDK's low-level ``Server``) for ``tools``.

    ``tools`` is a registry or anything :class:`ToolRegistry` accepts.
    ``name`` and ``version`` (default: the toolservices version) are the
    ``serverInfo`` clients see. ``tool_timeout`` is the time limit of a call
    to a tool without its own ``timeout`` (as in :class:`~toolservices.Dispatcher`).
    """
    return _build(tools, name=name, version=version, tool_timeout=tool_timeout)[0]


def _build(
    tools: ToolRegistry | Iterable[Any],
    *,
    name: str,
    version: str | None = None,
    tool_timeout: float | None,
) -> tuple[Server[Any], _Calls]:
    registry = tools if isinstance(tools, ToolRegistry) else ToolRegistry(tools)
    # The dispatcher's single-call path: the same validation, time limits and
    # failure text as a rollout's calls. No state: an MCP client has no episode.
    dispatcher = Dispatcher(registry, timeout=tool_timeout, pass_state=False)
    calls = _Calls()

    async def list_tools(
        ctx: ServerRequestContext[Any], params: mt.PaginatedRequestParams | None
    ) -> mt.ListToolsResult:
        return mt.ListToolsResult(tools=[_spec(t) for t in registry])

    async def call_tool(
        ctx: ServerRequestContext[Any], params: mt.CallToolRequestParams
    ) -> mt.CallToolResult:
        if params.name not in registry:
            available = ", ".join(registry.names()) or "none"
            hint = (
                " (the shell tools are served with `toolservices serve --mcp --shell`)"
                if params.name in SHELL_TOOL_NAMES
                else ""
            )
            raise MCPError(
                code=mt.INVALID_PARAMS,
                message=escape_text(
                    f"Unknown tool: {params.name}. Available tools: {available}{hint}"
                ),
            )
        if calls.draining:
            return _error(SHUTDOWN_REFUSED)
        token = _CONNECTION.set(_connection_of(ctx))
        namespace = _NAMESPACE.set(_namespace_of(ctx))
        scope = calls.open()
        try:
            with scope:
                outcome = await dispatcher.acall(
                    ToolCall(params.name, dict(params.arguments or {}))
                )
        finally:
            calls.close(scope)
            _NAMESPACE.reset(namespace)
            _CONNECTION.reset(token)
        if scope.cancelled_caught:
            return _error(SHUTDOWN_CANCELLED)
        if not outcome.ok:
            return escape_result(_error(outcome.error or "unknown error"))
        return escape_result(_result(outcome.value, outcome.content))

    server: Server[Any] = Server(
        name,
        version=version if version is not None else library_version(),
        on_list_tools=list_tools,
        on_call_tool=call_tool,
        get_tool_input_schema=lambda n: _schema(registry.get(n)) if n in registry else None,
    )
    return server, calls


def _connection_of(ctx: ServerRequestContext[Any]) -> str | None:
    """The request's MCP session id over HTTP, else what the transport set (``"stdio"``)."""
    headers = getattr(ctx.request, "headers", None)
    if headers is not None:
        session = headers.get("mcp-session-id")
        return str(session) if session else None
    return _CONNECTION.get()


def _namespace_of(ctx: ServerRequestContext[Any]) -> str | None:
    """What the HTTP front proved for this request (see :data:`NAMESPACE_SCOPE_KEY`)."""
    scope = getattr(ctx.request, "scope", None)
    namespace = scope.get(NAMESPACE_SCOPE_KEY) if isinstance(scope, Mapping) else None
    return str(namespace) if namespace is not None else None


def _schema(tool: Tool) -> dict[str, Any]:
    return tool.schema_in or {"type": "object", "properties": {}}


def _spec(tool: Tool) -> mt.Tool:
    return mt.Tool(name=tool.name, description=tool.description or None, input_schema=_schema(tool))


def _error(message: str) -> mt.CallToolResult:
    return mt.CallToolResult(content=[mt.TextContent(type="text", text=message)], is_error=True)


def _result(value: Any, text: str) -> mt.CallToolResult:
    """A successful call; ``text`` is the value as the dispatcher rendered it.

    Media values (:mod:`toolservices.mcp._content`) become their own content blocks.
    """
    blocks = to_blocks(value)
    if blocks is not None:
        return mt.CallToolResult(content=blocks)
    if isinstance(value, str):
        return mt.CallToolResult(content=[mt.TextContent(type="text", text=value)])
    structured = dict(value) if isinstance(value, Mapping) else None
    return mt.CallToolResult(
        content=[mt.TextContent(type="text", text=text)], structured_content=structured
    )


# --- running it ---------------------------------------------------------------------------


async def aserve(
    tools: ToolRegistry | Iterable[Any],
    *,
    transport: Transport = "stdio",
    host: str = "127.0.0.1",
    port: int = 8765,
    path: str = "/mcp",
    name: str = IMPLEMENTATION_NAME,
    tool_timeout: float | None = None,
    on_ready: Callable[[str], None] | None = None,
    max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES,
    session_idle_timeout: float | None = DEFAULT_SESSION_IDLE_TIMEOUT,
    shutdown_grace: float = DEFAULT_SHUTDOWN_GRACE,
    on_disconnect: Callable[[str], Awaitable[None]] | None = None,
    background: Callable[[], Coroutine[Any, Any, None]] | None = None,
    tokens: Iterable[str] | None = None,
    resume_buffer_bytes: int = DEFAULT_RESUME_BUFFER_BYTES,
) -> None:
    """Serve ``tools`` until the client leaves (stdio), SIGINT/SIGTERM arrives or the
    caller cancels; then drain (see the module docstring) and return.

    ``port=0`` picks a free port; ``on_ready`` receives ``"stdio"`` or the
    server's URL once it accepts connections. HTTP only: ``max_request_bytes``
    caps a request body (beyond it: HTTP 413 with a JSON-RPC error saying so);
    an MCP session without any request for ``session_idle_timeout`` seconds is
    ended (``None``: never). ``on_disconnect(connection)`` runs when an HTTP
    client ends its MCP session (DELETE; see :func:`current_connection`);
    ``background()`` runs while serving and is cancelled at shutdown. With
    ``tokens`` (HTTP only) every request needs ``Authorization: Bearer`` one
    of them (else 401), and tools see the namespace it proves through
    :func:`current_namespace`. Over HTTP every event carries an id, and up to
    ``resume_buffer_bytes`` of recent events are kept so that a client whose
    event stream dropped can reconnect with ``Last-Event-ID`` and still get
    its result (``0``: no ids, no resuming). Signals are handled only in the
    main thread.
    """
    if transport not in ("stdio", "http"):
        raise UserError(f"Unknown MCP transport {transport!r}; valid: 'stdio', 'http'")
    if max_request_bytes < 1:
        raise UserError(f"max_request_bytes must be positive, got {max_request_bytes}")
    if session_idle_timeout is not None and not 0 < session_idle_timeout < math.inf:
        raise UserError(
            f"session_idle_timeout must be positive or None, got {session_idle_timeout}"
        )
    if resume_buffer_bytes < 0:
        raise UserError(f"resume_buffer_bytes must be >= 0, got {resume_buffer_bytes}")
    if not 0 <= shutdown_grace < math.inf:
        raise UserError(f"shutdown_grace must be >= 0 seconds, got {shutdown_grace}")
    checked = None
    if tokens is not None:
        if transport != "http":
            raise UserError("tokens need the 'http' transport (stdio has one client: its parent)")
        from toolservices.mcp._auth import Tokens

        checked = Tokens(tokens)
    server, calls = _build(tools, name=name, tool_timeout=tool_timeout)
    async with anyio.create_task_group() as tg:
        if background is not None:
            tg.start_soon(background)
        if transport == "stdio":
            from toolservices.mcp._stdio import serve_stdio

            await serve_stdio(
                server, calls, grace=shutdown_grace, on_ready=on_ready, signals=_signals()
            )
        else:
            from toolservices.mcp._http import serve_http

            await serve_http(
                server,
                calls,
                host=host,
                port=port,
                path=path,
                grace=shutdown_grace,
                max_request_bytes=max_request_bytes,
                session_idle_timeout=session_idle_timeout,
                on_ready=on_ready,
                on_disconnect=on_disconnect,
                signals=_signals(),
                tokens=checked,
                resume_buffer_bytes=resume_buffer_bytes,
            )
        tg.cancel_scope.cancel()


def _signals() -> tuple[signal.Signals, ...]:
    """The signals :func:`aserve` drains on: SIGINT and SIGTERM, in the main thread only."""
    if threading.current_thread() is threading.main_thread():
        return (signal.SIGINT, signal.SIGTERM)
    return ()


def _blocking(run: Callable[P, Coroutine[Any, Any, None]], *, name: str) -> Callable[P, None]:
    """``run`` with its own event loop (same parameters), for callers without one."""

    @functools.wraps(run)
    def blocking(*args: P.args, **kwargs: P.kwargs) -> None:
        anyio.run(functools.partial(run, *args, **kwargs))

    blocking.__name__ = blocking.__qualname__ = name
    blocking.__doc__ = (
        f"Blocking :func:`{run.__name__}` (runs its own event loop; call from the main thread)."
    )
    return blocking


serve = _blocking(aserve, name="serve")


def _announce(where: str) -> None:
    """Tell a human (or a test) where the server listens; stdout is the wire on stdio."""
    print(f"toolservices MCP server ready: {where}", file=sys.stderr, flush=True)
