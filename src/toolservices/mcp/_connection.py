"""One MCP server connection: a long-lived task that owns the session and restarts it.

The SDK requires a session to be closed by the task that opened it, so each
server gets one runner task on the bridge's event loop. The runner opens the
transport and session in its own :class:`~contextlib.AsyncExitStack`, waits
until the connection is lost or the bridge closes, tears down in the same
task, and reconnects with bounded retries and exponential backoff. Calls run
in their callers' tasks and share the session (JSON-RPC ids keep them apart).
"""

from __future__ import annotations

import enum
import logging
import sys
from contextlib import AsyncExitStack
from typing import Any

import anyio
import httpx2
import mcp.types as mt
from anyio.abc import TaskStatus
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream
from mcp import ClientSession, MCPError, StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client
from mcp.shared.message import SessionMessage

from toolservices.errors import (
    ServiceUnavailableError,
    ToolArgumentError,
    ToolExecutionError,
    ToolNotFoundError,
    ToolTimeoutError,
)
from toolservices.mcp._config import (
    IMPLEMENTATION_NAME,
    HttpServer,
    ServerConfig,
    StdioServer,
    library_version,
)
from toolservices.mcp._result import MCPResult

__all__ = ["MCPAuthError", "MCPConnectionError", "ServerConnection", "ServerState"]

logger = logging.getLogger(__name__)

#: Upper bound of the wait between two reconnection attempts.
MAX_BACKOFF = 5.0

#: A connection that answered a call or lived this long was healthy: losing it
#: starts a fresh retry budget. One that dies sooner counts as a failed attempt,
#: so a server that crashes right after starting cannot restart forever.
STABLE_AFTER = 10.0


class MCPConnectionError(ServiceUnavailableError):
    """An MCP server is unreachable or dropped the connection.

    ``retryable`` is true while the bridge is restarting or reconnecting the
    server, false once it gave up (or was closed).
    """


class MCPAuthError(MCPConnectionError):
    """An HTTP server refused our credentials (HTTP 401 or 403).

    ``status`` is the HTTP status and ``www_authenticate`` the server's
    ``WWW-Authenticate`` challenge (what it wants sent), if it gave one. Never
    retryable: the same request with the same credentials gets the same answer.
    """

    def __init__(self, message: str, *, status: int, www_authenticate: str | None) -> None:
        super().__init__(message, retryable=False)
        self.status = status
        self.www_authenticate = www_authenticate


#: HTTP statuses that refuse the credentials, not the request.
_AUTH_STATUSES = (401, 403)


class ServerState(enum.Enum):
    """Where a server connection is in its life."""

    CONNECTING = "connecting"
    READY = "ready"
    RECONNECTING = "reconnecting"
    FAILED = "failed"
    CLOSED = "closed"


class ServerConnection:
    """A named server, its session while connected, and its tool listing.

    Create it inside the bridge loop (it makes anyio events) and start
    :meth:`run` with ``TaskGroup.start``: that returns once the first
    connection is up, or raises :class:`MCPConnectionError`.
    """

    def __init__(
        self,
        name: str,
        config: ServerConfig,
        *,
        connect_timeout: float,
        max_restarts: int,
        backoff: float,
    ) -> None:
        self.name = name
        self.config = config
        self.connect_timeout = connect_timeout
        self.max_restarts = max_restarts
        self.backoff = backoff
        self.state = ServerState.CONNECTING
        self.tools: dict[str, mt.Tool] = {}
        #: How the server introduced itself (``serverInfo``), once connected.
        self.server_info: mt.Implementation | None = None
        #: How often the connection was lost and a restart begun.
        self.restarts = 0
        self.last_error: BaseException | None = None
        self._session: ClientSession | None = None
        self._generation = 0
        self._served = False  # the current connection answered a call
        #: The last HTTP 401/403 seen (status, WWW-Authenticate) and how many so far:
        #: the SDK keeps only the body's message, so a response hook keeps these.
        self._refusal: tuple[int, str | None] | None = None
        self._refusals = 0
        self._changed = anyio.Event()  # replaced on each state change
        self._lost = anyio.Event()  # replaced per connection generation
        self._closing = anyio.Event()
        self.done = anyio.Event()

    # --- lifecycle -------------------------------------------------------------

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Keep the server connected until :meth:`request_close`."""
        started = False
        failures = 0  # consecutive attempts that did not give a healthy connection
        try:
            while not self._closing.is_set():
                connected_at: float | None = None
                cause: BaseException | str = "the connection was lost right after it was made"
                refusals = self._refusals
                try:
                    async with AsyncExitStack() as stack:
                        session, tools = await self._open(stack)
                        self._session, self.tools = session, tools
                        self._served = False
                        connected_at = anyio.current_time()
                        self._set_state(ServerState.READY)
                        if not started:
                            started = True
                            task_status.started()
                        await self._lost.wait()
                        self._session = None
                # Any failure to open, initialise or list is a failed attempt (and
                # a transport may also raise while tearing a dead connection down);
                # the cause is kept, reported on the first connect, and counted.
                except Exception as exc:
                    self._session = None
                    refused = self._refused(
                        refusals, f"Could not connect to MCP server '{self.name}'", exc
                    )
                    self.last_error = cause = refused or exc
                    if refused is not None and not started:
                        raise refused from exc
                    if not started:
                        raise MCPConnectionError(
                            f"Could not connect to MCP server '{self.name}': {_describe(exc)}",
                            retryable=False,
                        ) from exc
                if self._closing.is_set():
                    break
                self._set_state(ServerState.RECONNECTING)
                if connected_at is not None:
                    self.restarts += 1
                    logger.warning("MCP server %r: connection lost, reconnecting", self.name)
                    if self._served or anyio.current_time() - connected_at >= STABLE_AFTER:
                        failures = 0
                        continue  # a healthy connection died: reconnect at once
                failures += 1
                if failures > self.max_restarts:
                    logger.error(
                        "MCP server %r: giving up after %d failed reconnection attempts: %s",
                        self.name,
                        self.max_restarts,
                        cause if isinstance(cause, str) else _describe(cause),
                    )
                    self._set_state(ServerState.FAILED)
                    return
                delay = min(self.backoff * 2 ** (failures - 1), MAX_BACKOFF)
                with anyio.move_on_after(delay):
                    await self._closing.wait()
        finally:
            self._session = None
            if self.state is not ServerState.FAILED:
                self._set_state(ServerState.CLOSED)
            self.done.set()

    def request_close(self) -> None:
        """Ask the runner to shut the server down (it does so in its own task)."""
        self._closing.set()
        self._lost.set()

    def mark_lost(self, generation: int) -> None:
        """Report that the connection of ``generation`` is dead.

        New calls stop using it at once and wait for the runner's next one.
        """
        if generation == self._generation and not self._lost.is_set():
            self._lost.set()
            self._session = None
            if not self._closing.is_set():
                self._set_state(ServerState.RECONNECTING)

    async def _open(self, stack: AsyncExitStack) -> tuple[ClientSession, dict[str, mt.Tool]]:
        self._generation += 1
        generation = self._generation
        self._lost = anyio.Event()
        read, write = await self._enter_transport(stack)
        # Relay the transport's read stream so its end (server exit, EOF) is
        # seen at once, even when no call is in flight.
        relay_send, relay_recv = anyio.create_memory_object_stream[SessionMessage | Exception](0)
        relay = await stack.enter_async_context(anyio.create_task_group())
        stack.callback(relay.cancel_scope.cancel)
        relay.start_soon(self._relay, read, relay_send, generation)
        session = await stack.enter_async_context(
            ClientSession(
                relay_recv,
                write,
                read_timeout_seconds=self.connect_timeout,
                client_info=mt.Implementation(name=IMPLEMENTATION_NAME, version=library_version()),
            )
        )
        with anyio.fail_after(self.connect_timeout):
            initialized = await session.initialize()
            self.server_info = initialized.server_info
            tools = await _list_all_tools(session)
        return session, {t.name: t for t in tools}

    async def _enter_transport(self, stack: AsyncExitStack) -> Any:
        config = self.config
        if isinstance(config, StdioServer):
            params = StdioServerParameters(
                command=config.command,
                args=list(config.args),
                env=config.child_env(),
                cwd=config.cwd,
            )
            return await stack.enter_async_context(stdio_client(params, errlog=sys.stderr))
        assert isinstance(config, HttpServer)
        # No HTTP read timeout: each request is bounded by the call's own timeout.
        client = create_mcp_http_client(
            headers=dict(config.headers),
            timeout=httpx2.Timeout(self.connect_timeout, read=None),
        )
        client.event_hooks["response"].append(self._note_refusal)
        await stack.enter_async_context(client)
        return await stack.enter_async_context(
            streamable_http_client(config.url, http_client=client)
        )

    async def _relay(
        self,
        source: MemoryObjectReceiveStream[SessionMessage | Exception],
        sink: MemoryObjectSendStream[SessionMessage | Exception],
        generation: int,
    ) -> None:
        async with sink:
            try:
                async for item in source:
                    await sink.send(item)
            except (anyio.BrokenResourceError, anyio.ClosedResourceError):
                pass  # the session side closed first: this is our own teardown
        self.mark_lost(generation)

    async def _note_refusal(self, response: httpx2.Response) -> None:
        if response.status_code in _AUTH_STATUSES:
            self._refusal = (response.status_code, response.headers.get("www-authenticate"))
            self._refusals += 1

    def _refused(self, since: int, what: str, exc: BaseException) -> MCPAuthError | None:
        """The auth error to raise if a 401/403 arrived after the ``since``-th one."""
        if self._refusals == since or self._refusal is None:
            return None
        status, challenge = self._refusal
        reason = {401: "Unauthorized", 403: "Forbidden"}[status]
        header = f" (WWW-Authenticate: {challenge})" if challenge else ""
        inner = _innermost(exc)
        said = inner.message if isinstance(inner, MCPError) else _describe(inner)
        return MCPAuthError(
            f"{what}: HTTP {status} {reason}{header}: {said}",
            status=status,
            www_authenticate=challenge,
        )

    def _set_state(self, state: ServerState) -> None:
        self.state = state
        self._changed.set()
        self._changed = anyio.Event()

    # --- calls -------------------------------------------------------------------

    async def _ready_session(self) -> tuple[ClientSession, int]:
        while True:
            if self.state is ServerState.READY and self._session is not None:
                return self._session, self._generation
            if self.state in (ServerState.FAILED, ServerState.CLOSED):
                cause = f": {_describe(self.last_error)}" if self.last_error else ""
                raise MCPConnectionError(
                    f"MCP server '{self.name}' is unavailable ({self.state.value}){cause}",
                    retryable=False,
                )
            await self._changed.wait()

    # The timeout travels to the SDK as the request's read timeout (which also
    # sends the server a cancellation), so it is a parameter, not a cancel scope.
    async def call(self, tool: str, args: dict[str, Any], timeout: float) -> MCPResult:  # noqa: ASYNC109
        """Call ``tool``; map every failure to one of the library's error types."""
        qualified = f"{self.name}.{tool}"
        deadline = anyio.current_time() + timeout
        resent = False
        while True:
            with anyio.move_on_after(max(deadline - anyio.current_time(), 0)) as waiting:
                session, generation = await self._ready_session()
            if waiting.cancelled_caught:
                raise MCPConnectionError(
                    f"MCP server '{self.name}' did not become ready within {timeout:g}s "
                    f"(state: {self.state.value})",
                    retryable=True,
                )
            remaining = max(deadline - anyio.current_time(), 0.001)
            refusals = self._refusals
            try:
                result = await session.call_tool(tool, args, read_timeout_seconds=remaining)
            except MCPError as exc:
                refused = self._refused(
                    refusals, f"MCP server '{self.name}' refused '{qualified}'", exc
                )
                if refused is not None:
                    raise refused from exc
                if self._session_unknown(exc) and not resent:
                    # The HTTP server no longer knows our session (it restarted
                    # or expired it: HTTP 404). The call was refused, not run,
                    # so open a new session and send it once more.
                    resent = True
                    self.mark_lost(generation)
                    continue
                raise self._call_error(exc, tool, generation, timeout) from exc
            except (anyio.BrokenResourceError, anyio.ClosedResourceError) as exc:
                self.mark_lost(generation)
                raise self._lost_error(qualified) from exc
            break
        if not isinstance(result, mt.CallToolResult):
            raise ToolExecutionError(f"MCP tool '{qualified}' returned an unsupported result")
        if generation == self._generation:
            self._served = True
        if result.is_error and tool not in self.tools:
            raise self._not_found(tool)
        return MCPResult.from_mcp(self.name, tool, result)

    def _session_unknown(self, exc: MCPError) -> bool:
        """Whether an HTTP server rejected the request because our session is gone.

        The SDK reports both spellings of the HTTP 404 ("Session not found" in
        the server's JSON-RPC body, "Session terminated" otherwise) as
        ``INVALID_REQUEST``, which a well-formed ``tools/call`` never earns.
        """
        return isinstance(self.config, HttpServer) and exc.code == mt.INVALID_REQUEST

    def _call_error(self, exc: MCPError, tool: str, generation: int, timeout: float) -> Exception:
        qualified = f"{self.name}.{tool}"
        if exc.code == mt.CONNECTION_CLOSED:
            if self._closing.is_set():
                return MCPConnectionError(
                    f"MCP server '{self.name}' was shut down during the call to '{qualified}'",
                    retryable=False,
                )
            self.mark_lost(generation)
            return self._lost_error(qualified)
        if exc.code == mt.REQUEST_TIMEOUT:
            return ToolTimeoutError(f"MCP tool '{qualified}' did not answer within {timeout:g}s")
        if exc.code == mt.INVALID_PARAMS:
            if tool not in self.tools:
                return self._not_found(tool)
            return ToolArgumentError(f"Invalid arguments for tool '{qualified}': {exc.message}")
        return ToolExecutionError(f"MCP tool '{qualified}' failed: {exc.message} (code {exc.code})")

    def _lost_error(self, qualified: str) -> MCPConnectionError:
        return MCPConnectionError(
            f"MCP server '{self.name}' closed the connection during the call to '{qualified}'; "
            "it is being restarted and the call may be retried",
            retryable=True,
        )

    def _not_found(self, tool: str) -> ToolNotFoundError:
        available = ", ".join(f"{self.name}.{t}" for t in sorted(self.tools)) or "none"
        return ToolNotFoundError(f"Unknown tool: {self.name}.{tool}. Available tools: {available}")


async def _list_all_tools(session: ClientSession) -> list[mt.Tool]:
    capabilities = session.server_capabilities
    if capabilities is not None and capabilities.tools is None:
        return []  # a server of prompts or resources only
    tools: list[mt.Tool] = []
    cursor: str | None = None
    while True:
        params = mt.PaginatedRequestParams(cursor=cursor) if cursor else None
        page = await session.list_tools(params=params)
        tools.extend(page.tools)
        cursor = page.next_cursor
        if not cursor:
            return tools


def _innermost(exc: BaseException) -> BaseException:
    """The first leaf of nested exception groups (from task groups)."""
    while getattr(exc, "exceptions", None):  # BaseExceptionGroup (3.11+ or the backport)
        exc = exc.exceptions[0]  # type: ignore[attr-defined]
    return exc


def _describe(exc: BaseException | None) -> str:
    """A one-line cause, looking inside exception groups from task groups."""
    if exc is not None:
        exc = _innermost(exc)
    if exc is None:
        return "unknown error"
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
