"""The other direction: a ToolRegistry served as an MCP server (stdio or streamable HTTP).

Tools keep their names, descriptions and JSON Schemas. A tool's failure
(bad arguments, an exception, a timeout) becomes an ``isError`` result the
client's model can read; an unknown tool name is the JSON-RPC ``-32602``
error both MCP spec revisions ask for.
"""

from __future__ import annotations

import json
import signal
import socket
import sys
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Literal

import anyio
import mcp.types as mt
from mcp import MCPError
from mcp.server.context import ServerRequestContext
from mcp.server.lowlevel import Server
from mcp.server.stdio import stdio_server

from toolservices.dispatch import Dispatcher
from toolservices.errors import UserError
from toolservices.parsing.base import ToolCall
from toolservices.tools import Tool, ToolRegistry

__all__ = ["aserve", "build_server", "serve"]

Transport = Literal["stdio", "http"]


def build_server(
    tools: ToolRegistry | Iterable[Any],
    *,
    name: str = "toolservices",
    tool_timeout: float | None = None,
) -> Server[Any]:
    """An MCP server (the SDK's low-level ``Server``) for ``tools``.

    ``tools`` is a registry or anything :class:`ToolRegistry` accepts.
    ``tool_timeout`` is the time limit of a call to a tool without its own
    ``timeout`` (as in :class:`~toolservices.Dispatcher`).
    """
    registry = tools if isinstance(tools, ToolRegistry) else ToolRegistry(tools)
    # The dispatcher's single-call path: the same validation, time limits and
    # failure text as a rollout's calls. No state: an MCP client has no episode.
    dispatcher = Dispatcher(registry, timeout=tool_timeout, pass_state=False)

    async def list_tools(
        ctx: ServerRequestContext[Any], params: mt.PaginatedRequestParams | None
    ) -> mt.ListToolsResult:
        return mt.ListToolsResult(tools=[_spec(t) for t in registry])

    async def call_tool(
        ctx: ServerRequestContext[Any], params: mt.CallToolRequestParams
    ) -> mt.CallToolResult:
        if params.name not in registry:
            available = ", ".join(registry.names()) or "none"
            raise MCPError(
                code=mt.INVALID_PARAMS,
                message=f"Unknown tool: {params.name}. Available tools: {available}",
            )
        outcome = await dispatcher.acall(ToolCall(params.name, dict(params.arguments or {})))
        if not outcome.ok:
            return _error(outcome.error or "unknown error")
        return _result(outcome.value)

    return Server(
        name,
        on_list_tools=list_tools,
        on_call_tool=call_tool,
        get_tool_input_schema=lambda n: _schema(registry.get(n)) if n in registry else None,
    )


def _schema(tool: Tool) -> dict[str, Any]:
    return tool.schema_in or {"type": "object", "properties": {}}


def _spec(tool: Tool) -> mt.Tool:
    return mt.Tool(name=tool.name, description=tool.description or None, input_schema=_schema(tool))


def _error(message: str) -> mt.CallToolResult:
    return mt.CallToolResult(content=[mt.TextContent(type="text", text=message)], is_error=True)


def _result(value: Any) -> mt.CallToolResult:
    if isinstance(value, str):
        return mt.CallToolResult(content=[mt.TextContent(type="text", text=value)])
    structured = dict(value) if isinstance(value, Mapping) else None
    text = json.dumps(structured if structured is not None else value, indent=2, default=str)
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
    name: str = "toolservices",
    tool_timeout: float | None = None,
    on_ready: Callable[[str], None] | None = None,
) -> None:
    """Serve ``tools`` until the client leaves (stdio) or SIGINT/SIGTERM arrives.

    ``port=0`` picks a free port; ``on_ready`` receives ``"stdio"`` or the
    server's URL once it accepts connections.
    """
    server = build_server(tools, name=name, tool_timeout=tool_timeout)
    if transport == "stdio":
        async with anyio.create_task_group() as tg:
            tg.start_soon(_cancel_on_signal, tg.cancel_scope)
            async with stdio_server() as (read, write):
                if on_ready is not None:
                    on_ready("stdio")
                await server.run(read, write, server.create_initialization_options())
            tg.cancel_scope.cancel()
        return
    if transport != "http":
        raise UserError(f"Unknown MCP transport {transport!r}; valid: 'stdio', 'http'")
    import uvicorn

    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
        netloc = f"[{host}]" if ":" in host else host
        url = f"http://{netloc}:{sock.getsockname()[1]}{path}"
        app = server.streamable_http_app(streamable_http_path=path, host=host)
        config = uvicorn.Config(app, log_level="warning", lifespan="on")
        http = uvicorn.Server(config)
        if on_ready is not None:
            # uvicorn listens on the socket as soon as serve() starts.
            sock.listen(128)
            on_ready(url)
        await _serve_http(http, sock)
    finally:
        sock.close()


#: How long a cancelled :func:`aserve` lets uvicorn finish its graceful stop.
HTTP_STOP_GRACE = 10.0


async def _serve_http(http: Any, sock: socket.socket) -> None:
    """Run uvicorn until it stops itself (it handles SIGINT/SIGTERM) or we are cancelled.

    A cancellation asks for uvicorn's own graceful stop, bounded by
    :data:`HTTP_STOP_GRACE`, instead of tearing the server down mid-lifespan
    (which aborts in-flight requests and logs the lifespan's traceback).
    """
    stopped = anyio.Event()
    scope = anyio.CancelScope(shield=True)

    async def run() -> None:
        try:
            with scope:
                await http.serve(sockets=[sock])
        finally:
            stopped.set()

    async with anyio.create_task_group() as tg:
        tg.start_soon(run)
        try:
            await stopped.wait()
        finally:
            http.should_exit = True
            scope.deadline = anyio.current_time() + HTTP_STOP_GRACE


async def _cancel_on_signal(scope: anyio.CancelScope) -> None:
    with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        async for _ in signals:
            scope.cancel()
            return


def serve(
    tools: ToolRegistry | Iterable[Any],
    *,
    transport: Transport = "stdio",
    host: str = "127.0.0.1",
    port: int = 8765,
    path: str = "/mcp",
    name: str = "toolservices",
    tool_timeout: float | None = None,
    on_ready: Callable[[str], None] | None = None,
) -> None:
    """Blocking :func:`aserve` (runs its own event loop; call from the main thread)."""
    anyio.run(
        lambda: aserve(
            tools,
            transport=transport,
            host=host,
            port=port,
            path=path,
            name=name,
            tool_timeout=tool_timeout,
            on_ready=on_ready,
        )
    )


def _announce(where: str) -> None:
    """Tell a human (or a test) where the server listens; stdout is the wire on stdio."""
    print(f"toolservices MCP server ready: {where}", file=sys.stderr, flush=True)
