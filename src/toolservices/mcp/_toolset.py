"""MCPToolset: MCP servers' tools as toolservices tools, usable from sync and async code."""

from __future__ import annotations

import enum
import threading
import weakref
from collections.abc import Mapping
from types import TracebackType
from typing import Any

import anyio
import anyio.to_thread
import mcp.types as mt

from toolservices.errors import ToolExecutionError, ToolNotFoundError, UserError
from toolservices.mcp._bridge import Bridge
from toolservices.mcp._config import ServerConfig, coerce_servers
from toolservices.mcp._connection import MCPConnectionError, ServerConnection
from toolservices.mcp._result import MCPResult
from toolservices.tools import Tool, ToolRegistry

__all__ = ["MCPTool", "MCPToolset"]


class _Lifecycle(enum.Enum):
    UNOPENED = "unopened"
    OPEN = "open"
    CLOSED = "closed"


class MCPTool(Tool):
    """One tool of an MCP server, named ``"server.tool"``.

    Calling it returns the text a model reads (``str(MCPResult)``), so it
    renders like any local tool's string; :meth:`acall_result` returns the
    whole :class:`MCPResult`. A result the server flags with ``isError``
    raises :class:`~toolservices.errors.ToolExecutionError`, so the
    dispatcher reports a failed call.
    """

    is_async = True

    def __init__(self, toolset: MCPToolset, server: str, spec: mt.Tool) -> None:
        self.toolset = toolset
        self.server = server
        self.remote_name = spec.name
        self.name = f"{server}.{spec.name}"
        self.description = spec.description or spec.title or ""
        self.schema_in = dict(spec.input_schema) or {"type": "object", "properties": {}}
        self.schema_out = dict(spec.output_schema or {})
        # No per-tool limit: a dispatcher's own timeout applies, and the
        # toolset's timeout bounds the remote request in any case.
        self.timeout = None

    def __call__(self, **kwargs: Any) -> str:
        return str(_unwrap(self.toolset.call(self.name, kwargs)))

    async def acall(self, **kwargs: Any) -> str:
        return str(await self.acall_result(**kwargs))

    async def acall_result(self, **kwargs: Any) -> MCPResult:
        """The whole result (all parts, structured content); errors raise as in acall."""
        return _unwrap(await self.toolset.acall(self.name, kwargs))


def _info(info: mt.Implementation | None) -> dict[str, str] | None:
    return None if info is None else {"name": info.name, "version": info.version}


def _unwrap(result: MCPResult) -> MCPResult:
    if result.is_error:
        raise ToolExecutionError(result.text or f"MCP tool '{result.server}.{result.tool}' failed")
    return result


class MCPToolset:
    """The tools of one or more MCP servers, over stdio or streamable HTTP.

    ``servers`` maps a server name to a :class:`StdioServer`, an
    :class:`HttpServer` or the dict forms ``{"command", "args", "env"}`` and
    ``{"url", "headers"}``. All sessions run on one background event loop
    owned by the toolset; a server that dies is restarted (stdio) or
    reconnected (HTTP) up to ``max_restarts`` consecutive attempts with
    exponential backoff starting at ``backoff`` seconds.

    ``timeout`` bounds every tool call, ``connect_timeout`` the start,
    initialisation and tool listing of each server.
    """

    def __init__(
        self,
        servers: Mapping[str, ServerConfig | Mapping[str, Any]],
        *,
        timeout: float = 10.0,
        connect_timeout: float = 30.0,
        max_restarts: int = 3,
        backoff: float = 0.5,
    ) -> None:
        for label, value in (
            ("timeout", timeout),
            ("connect_timeout", connect_timeout),
            ("backoff", backoff),
        ):
            if not value > 0:
                raise UserError(f"MCPToolset: '{label}' must be positive, got {value!r}")
        if max_restarts < 0:
            raise UserError(f"MCPToolset: 'max_restarts' must be >= 0, got {max_restarts!r}")
        self.servers: dict[str, ServerConfig] = coerce_servers(servers)
        self.timeout = timeout
        self.connect_timeout = connect_timeout
        self.max_restarts = max_restarts
        self.backoff = backoff
        self._state = _Lifecycle.UNOPENED
        self._lock = threading.Lock()
        self._bridge: Bridge | None = None
        self._connections: dict[str, ServerConnection] = {}
        self._tools: dict[str, MCPTool] = {}
        self._finalizer: weakref.finalize[Any, Any] | None = None
        self._entered = 0

    # --- lifecycle -------------------------------------------------------------------

    def connect(self) -> MCPToolset:
        """Start every server and list its tools; raise if any server fails."""
        with self._lock:
            if self._state is _Lifecycle.OPEN:
                return self
            if self._state is _Lifecycle.CLOSED:
                raise UserError("This MCPToolset was closed; create a new one to reconnect")
            bridge = Bridge()
            # Safety net: interpreter exit closes the servers even without close().
            finalizer = weakref.finalize(self, bridge.close)
            try:
                self._connections = bridge.run(self._connect_all, bridge)
            except BaseException:
                finalizer()
                raise
            self._bridge, self._finalizer = bridge, finalizer
            self._tools = {
                tool.name: tool
                for name, conn in self._connections.items()
                for tool in self._make_tools(name, conn)
            }
            self._state = _Lifecycle.OPEN
        return self

    async def aconnect(self) -> MCPToolset:
        """:meth:`connect` for async code (the blocking part runs in a thread)."""
        return await anyio.to_thread.run_sync(self.connect)

    def close(self) -> None:
        """Shut down every server (process groups included). Idempotent."""
        with self._lock:
            self._state = _Lifecycle.CLOSED
            if self._finalizer is not None:
                self._finalizer()  # runs bridge.close() once
                self._bridge = self._finalizer = None

    async def aclose(self) -> None:
        """:meth:`close` for async code."""
        await anyio.to_thread.run_sync(self.close)

    def __enter__(self) -> MCPToolset:
        self.connect()
        with self._lock:
            self._entered += 1
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._leave():
            self.close()

    async def __aenter__(self) -> MCPToolset:
        await self.aconnect()
        with self._lock:
            self._entered += 1
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._leave():
            await self.aclose()

    def _leave(self) -> bool:
        """Count one exit of a ``with`` block; true when it was the outermost."""
        with self._lock:
            self._entered -= 1
            return self._entered == 0

    async def _connect_all(self, bridge: Bridge) -> dict[str, ServerConnection]:
        connections = {
            name: ServerConnection(
                name,
                config,
                connect_timeout=self.connect_timeout,
                max_restarts=self.max_restarts,
                backoff=self.backoff,
            )
            for name, config in self.servers.items()
        }
        bridge.connections.extend(connections.values())
        errors: list[MCPConnectionError] = []

        async def start(conn: ServerConnection) -> None:
            try:
                await bridge.task_group.start(conn.run)
            except MCPConnectionError as exc:
                errors.append(exc)

        async with anyio.create_task_group() as tg:
            for conn in connections.values():
                tg.start_soon(start, conn)
        if len(errors) == 1:
            raise errors[0]  # keeps its type (an MCPAuthError says what the server wants)
        if errors:
            messages = sorted(e.message for e in errors)
            raise MCPConnectionError("; ".join(messages), retryable=False)
        return connections

    def _make_tools(self, server: str, conn: ServerConnection) -> list[MCPTool]:
        return [MCPTool(self, server, spec) for spec in conn.tools.values()]

    # --- tools -------------------------------------------------------------------------

    def tools(self) -> list[MCPTool]:
        """Every discovered tool, as :class:`~toolservices.tools.Tool` objects."""
        self._require_open()
        return list(self._tools.values())

    def names(self) -> list[str]:
        """The ``"server.tool"`` names of every discovered tool."""
        self._require_open()
        return list(self._tools)

    def register_into(self, registry: ToolRegistry, *, replace: bool = False) -> list[MCPTool]:
        """Add every tool to ``registry``; a clashing name raises unless ``replace``."""
        tools = self.tools()
        clashes = [t.name for t in tools if t.name in registry]
        if clashes and not replace:
            raise UserError(
                f"Tools already registered: {', '.join(clashes)}; pass replace=True to replace them"
            )
        for tool in tools:
            registry.register(tool, replace=replace)
        return tools

    def status(self) -> dict[str, dict[str, Any]]:
        """Per server: state, how it introduced itself (``serverInfo`` name and
        version), restart count, tool names and the last error."""
        return {
            name: {
                "state": conn.state.value,
                "server": _info(conn.server_info),
                "restarts": conn.restarts,
                "tools": sorted(conn.tools),
                "last_error": repr(conn.last_error) if conn.last_error else None,
            }
            for name, conn in self._connections.items()
        }

    # --- calls ---------------------------------------------------------------------------

    def call(
        self, name: str, args: Mapping[str, Any] | None = None, *, timeout: float | None = None
    ) -> MCPResult:
        """Call ``"server.tool"`` and wait; see :meth:`acall`."""
        conn, tool = self._resolve(name)
        bridge = self._require_open()
        return bridge.run(conn.call, tool, dict(args or {}), timeout or self.timeout)

    # The per-call limit is sent to the server with the request, hence a parameter.
    async def acall(
        self,
        name: str,
        args: Mapping[str, Any] | None = None,
        *,
        timeout: float | None = None,  # noqa: ASYNC109
    ) -> MCPResult:
        """Call ``"server.tool"`` from any event loop.

        Returns the :class:`MCPResult` (``is_error`` set when the tool reported
        a failure). Raises :class:`~toolservices.errors.ToolNotFoundError` for
        an unknown tool, :class:`~toolservices.errors.ToolTimeoutError` when
        ``timeout`` passes, :class:`~toolservices.errors.ToolArgumentError` when
        the server rejects the arguments, and :class:`MCPConnectionError` when
        the server is gone.
        """
        conn, tool = self._resolve(name)
        bridge = self._require_open()
        return await bridge.arun(conn.call, tool, dict(args or {}), timeout or self.timeout)

    def _resolve(self, name: str) -> tuple[ServerConnection, str]:
        self._require_open()
        server, sep, tool = name.partition(".")
        conn = self._connections.get(server)
        if not sep or conn is None or not tool:
            available = ", ".join(sorted(self._tools)) or "none"
            raise ToolNotFoundError(f"Unknown tool: {name}. Available tools: {available}")
        return conn, tool

    def _require_open(self) -> Bridge:
        if self._state is _Lifecycle.UNOPENED:
            raise UserError("MCPToolset is not connected: call connect() or use 'with'")
        if self._bridge is None:
            raise MCPConnectionError("MCPToolset is closed", retryable=False)
        return self._bridge

    def __repr__(self) -> str:
        return f"MCPToolset(servers={list(self.servers)!r}, state={self._state.value!r})"
