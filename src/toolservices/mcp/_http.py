"""Serving over streamable HTTP (uvicorn) with a drain on SIGINT/SIGTERM.

:class:`HttpFront` wraps the SDK's ASGI app to add what the server promises
on HTTP:

* an over-large request body gets a JSON-RPC error that says what the limit
  is and which option sets it (the SDK answers a bare ``413``);
* the end of an MCP session (the client's DELETE) is reported to
  ``on_disconnect``, so per-client resources are freed with their client;
* at shutdown the long-lived GET event streams are ended cleanly (they would
  otherwise hold uvicorn's graceful stop open until its timeout);
* a POST body that is not JSON, or not a JSON-RPC message, is answered here
  with ``-32700`` / ``-32600`` and a one-line message (the SDK answers
  ``-32602`` with pydantic's whole report): see :mod:`toolservices.mcp._jsonrpc`;
* dropped event streams can be resumed: every SSE event has an id and a
  ``retry`` hint, and a bounded in-memory event store replays what a client
  missed when it reconnects with ``Last-Event-ID`` (see
  :mod:`toolservices.mcp._events`; the front tells the store which MCP
  session each request belongs to);
* with ``tokens``, every request must carry a valid bearer token (else 401
  with a JSON-RPC error saying what to send); the namespace it proves is put
  in the ASGI scope for the tools (see :func:`~toolservices.mcp.current_namespace`).

uvicorn runs without its own signal handlers: :func:`serve_http` handles
SIGINT/SIGTERM itself. It drains the calls in flight first (new calls are
refused, other requests still answered), and only then lets uvicorn stop:
close the listener, end the event streams, wait for the last answers to be
written, end the MCP sessions. (uvicorn alone would stop listening at once,
wait for the calls, then re-raise the signal.)
"""

from __future__ import annotations

import contextlib
import json
import signal
import socket
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import Any

import anyio
import uvicorn
from mcp.server.lowlevel import Server
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from toolservices.mcp._auth import AuthFailure, Tokens, header_value
from toolservices.mcp._events import MemoryEventStore, SessionRef, current_session_ref
from toolservices.mcp._jsonrpc import check_message, error_body
from toolservices.mcp._serving import NAMESPACE_SCOPE_KEY, _Calls, wait_for_signals

__all__ = ["HttpFront", "serve_http"]

#: uvicorn's own last resort after a drain: connections still open are then cut.
UVICORN_STOP_MARGIN = 5.0
#: How long an HTTP server that is cancelled (not signalled) may take to stop.
HTTP_STOP_GRACE = 10.0
_SESSION_HEADER = b"mcp-session-id"
#: The ``retry`` hint of the event streams: how long a client waits before reconnecting (ms).
RETRY_INTERVAL_MS = 1000
#: JSON-RPC "Invalid Request".
_INVALID_REQUEST = -32600


@dataclass
class _Exchange:
    """What the wrapped app answered to one request."""

    status: int | None = None
    started: bool = False
    complete: bool = False
    replaced: bool = False


class HttpFront:
    """ASGI middleware in front of the SDK's streamable HTTP app (see the module docstring)."""

    def __init__(
        self,
        app: ASGIApp,
        *,
        path: str,
        max_request_bytes: int,
        on_disconnect: Callable[[str], Awaitable[None]] | None = None,
        tokens: Tokens | None = None,
    ) -> None:
        self.app = app
        self.path = path
        self.max_request_bytes = max_request_bytes
        self.on_disconnect = on_disconnect
        self.tokens = tokens
        self._streams: set[anyio.Event] = set()
        self._closing = False

    def close_streams(self) -> None:
        """End every open GET event stream now and refuse new ones (shutdown)."""
        self._closing = True
        for stop in list(self._streams):
            stop.set()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if self.tokens is not None:
            try:
                namespace = self.tokens.namespace(
                    scope.get("headers", ()), scope.get("query_string", b"")
                )
            except AuthFailure as failure:
                await _json_error(send, failure.status, failure.message, failure.challenge)
                return
            scope = {**scope, NAMESPACE_SCOPE_KEY: namespace}
        ref = SessionRef(_header(scope, _SESSION_HEADER))
        token = current_session_ref.set(ref)
        try:
            await self._handle(scope, receive, send, ref)
        finally:
            current_session_ref.reset(token)

    async def _handle(self, scope: Scope, receive: Receive, send: Send, ref: SessionRef) -> None:
        method = scope["method"]
        session = ref.session
        if method == "GET" and self._closing:
            await _json_error(send, 503, "The server is shutting down")
            return
        if method == "POST" and scope.get("path") == self.path and _is_json(scope):
            body = await self._read_body(scope, receive, send)
            if body is None:
                return  # answered already
            receive = _replay(body, receive)
        exchange = _Exchange()
        send_through = self._watch(exchange, scope, send, ref)
        if method != "GET":
            await self.app(scope, receive, send_through)
        else:
            with self._stream_stopper() as stop:
                await self.app(scope, _until(stop, receive), send_through)
            if exchange.started and not exchange.complete and not exchange.replaced:
                # The stream ended on our account: end the response properly.
                with contextlib.suppress(OSError):  # the peer is gone already
                    await send({"type": "http.response.body", "body": b"", "more_body": False})
        # Only the client's own DELETE counts: a 404 can also answer a credential
        # that does not own a live session (SDK auth), and an expired session's
        # resources have been idle as long and expire with it.
        ended = method == "DELETE" and exchange.status == 200
        if ended and session is not None and self.on_disconnect is not None:
            await self.on_disconnect(session)

    async def _read_body(self, scope: Scope, receive: Receive, send: Send) -> bytes | None:
        """The whole body, if it is a JSON-RPC message; else answer it and return ``None``."""
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return None
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_request_bytes:
                await _json_error(send, 413, self._too_large(scope))
                return None
            chunks.append(chunk)
            if not message.get("more_body"):
                break
        body = b"".join(chunks)
        error = check_message(body)
        if error is not None:
            await _send_json(send, 400, error_body(error))
            return None
        return body

    @contextlib.contextmanager
    def _stream_stopper(self) -> Iterator[anyio.Event]:
        stop = anyio.Event()
        self._streams.add(stop)
        try:
            yield stop
        finally:
            self._streams.discard(stop)

    def _watch(self, exchange: _Exchange, scope: Scope, send: Send, ref: SessionRef) -> Send:
        async def send_through(message: Message) -> None:
            if exchange.replaced:
                return
            if message["type"] == "http.response.start":
                exchange.status = int(message["status"])
                if ref.session is None:  # the request that opens a session: learn its id
                    ref.session = header_value(message.get("headers", ()), _SESSION_HEADER)
                if exchange.status == 413:
                    exchange.replaced = True
                    await _json_error(send, 413, self._too_large(scope))
                    return
                exchange.started = True
            elif message["type"] == "http.response.body" and not message.get("more_body"):
                exchange.complete = True
            await send(message)

        return send_through

    def _too_large(self, scope: Scope) -> str:
        declared = _header(scope, b"content-length")
        size = f" ({declared} bytes)" if declared is not None and declared.isdigit() else ""
        return (
            f"Request body too large{size}: this server accepts at most "
            f"{self.max_request_bytes} bytes per request (server option max_request_bytes, "
            "--max-request-bytes on the command line). Send less data per call."
        )


def _header(scope: Scope, name: bytes) -> str | None:
    return header_value(scope.get("headers", ()), name)


def _is_json(scope: Scope) -> bool:
    """Whether the request says its body is JSON (else the SDK answers 415 itself)."""
    content_type = _header(scope, b"content-type") or ""
    return content_type.split(";")[0].strip().lower() == "application/json"


def _replay(body: bytes, receive: Receive) -> Receive:
    """``receive`` that hands out the body read already, then passes through."""
    pending = [{"type": "http.request", "body": body, "more_body": False}]

    async def replayed() -> Message:
        if pending:
            return pending.pop()
        return await receive()

    return replayed


def _until(stop: anyio.Event, receive: Receive) -> Receive:
    """``receive`` that reports a disconnect once ``stop`` is set."""

    async def receive_or_stop() -> Message:
        message: Message = {"type": "http.disconnect"}
        if stop.is_set():
            return message
        async with anyio.create_task_group() as tg:

            async def real() -> None:
                nonlocal message
                message = await receive()
                tg.cancel_scope.cancel()

            async def stopped() -> None:
                await stop.wait()
                tg.cancel_scope.cancel()

            tg.start_soon(real)
            tg.start_soon(stopped)
        return message

    return receive_or_stop


async def _json_error(send: Send, status: int, message: str, challenge: str | None = None) -> None:
    body = json.dumps(
        {"jsonrpc": "2.0", "id": None, "error": {"code": _INVALID_REQUEST, "message": message}}
    ).encode()
    await _send_json(send, status, body, challenge)


async def _send_json(send: Send, status: int, body: bytes, challenge: str | None = None) -> None:
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
    ]
    if challenge is not None:
        headers.append((b"www-authenticate", challenge.encode()))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body, "more_body": False})


class _Uvicorn(uvicorn.Server):
    """uvicorn without its signal handlers: :func:`serve_http` owns SIGINT/SIGTERM."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


async def serve_http(
    server: Server[Any],
    calls: _Calls,
    *,
    host: str,
    port: int,
    path: str,
    grace: float,
    max_request_bytes: int,
    session_idle_timeout: float | None,
    on_ready: Callable[[str], None] | None,
    on_disconnect: Callable[[str], Awaitable[None]] | None,
    signals: tuple[signal.Signals, ...],
    tokens: Tokens | None = None,
    resume_buffer_bytes: int = 0,
) -> None:
    """Serve until a signal (drain, then stop) or cancellation (stop within a bound).

    ``resume_buffer_bytes`` bounds the event store (0: streams cannot be resumed).
    """
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
        netloc = f"[{host}]" if ":" in host else host
        url = f"http://{netloc}:{sock.getsockname()[1]}{path}"
        app = server.streamable_http_app(
            streamable_http_path=path,
            host=host,
            max_request_body_size=max_request_bytes,
            session_idle_timeout=session_idle_timeout,
            event_store=MemoryEventStore(max_bytes=resume_buffer_bytes)
            if resume_buffer_bytes > 0
            else None,
            retry_interval=RETRY_INTERVAL_MS if resume_buffer_bytes > 0 else None,
        )
        front = HttpFront(
            app,
            path=path,
            max_request_bytes=max_request_bytes,
            on_disconnect=on_disconnect,
            tokens=tokens,
        )
        config = uvicorn.Config(
            front,
            log_level="warning",
            lifespan="on",
            timeout_graceful_shutdown=int(grace + UVICORN_STOP_MARGIN),
        )
        http = _Uvicorn(config)
        if on_ready is not None:
            # uvicorn listens on the socket as soon as serve() starts.
            sock.listen(128)
            on_ready(url)
        await _run(http, sock, front, calls, grace, signals)
    finally:
        sock.close()


async def _run(
    http: _Uvicorn,
    sock: socket.socket,
    front: HttpFront,
    calls: _Calls,
    grace: float,
    signals: tuple[signal.Signals, ...],
) -> None:
    """Run uvicorn; on a signal drain the calls, on cancellation stop within a bound.

    uvicorn runs shielded so that a cancellation becomes its own graceful stop
    (tearing it down mid-lifespan would abort requests and log the lifespan's
    traceback), bounded by :data:`HTTP_STOP_GRACE`.
    """
    stopped = anyio.Event()
    shield = anyio.CancelScope(shield=True)

    async def run() -> None:
        try:
            with shield:
                await http.serve(sockets=[sock])
        finally:
            stopped.set()

    def stop() -> None:
        http.should_exit = True  # stop accepting; uvicorn waits for open exchanges
        front.close_streams()

    first, second = anyio.Event(), anyio.Event()

    async def drain_on_signal() -> None:
        await first.wait()
        # Listen on while draining: a client may still need to ask something
        # (the SDK client lists the tools to check a structured result).
        await calls.drain(grace, second)
        stop()  # uvicorn's own wait is bounded (timeout_graceful_shutdown)

    async with anyio.create_task_group() as tg:
        tg.start_soon(run)
        # Signals stay ours until uvicorn has stopped: a third one changes nothing.
        tg.start_soon(wait_for_signals, signals, first, second)
        tg.start_soon(drain_on_signal)
        try:
            await stopped.wait()
        finally:
            tg.cancel_scope.cancel()
            stop()
            calls.cancel_all()
            shield.deadline = anyio.current_time() + HTTP_STOP_GRACE
