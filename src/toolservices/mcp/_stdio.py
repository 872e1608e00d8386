"""Serving over stdio with a drain on SIGINT/SIGTERM.

Three things the SDK's ``stdio_server`` does not do for us:

* its stdin reader blocks a worker thread that only a line or EOF frees, so a
  signalled server waited for its client to close stdin; we hand it a reader
  that waits for readability on the event loop instead (cancellable);
* ending the session early must not lose answers: requests are counted on
  the way in and their answers on the way out, and the server is given EOF
  only once every request received has been answered (or the drain's bound
  has passed);
* a line that is not JSON, or not a JSON-RPC message, is answered with
  ``-32700`` / ``-32600`` (the SDK drops it without a word): see
  :mod:`toolservices.mcp._jsonrpc`.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import stat
from collections.abc import Callable, Iterator
from typing import Any

import anyio
import mcp.types as mt
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream
from mcp.server.lowlevel import Server
from mcp.server.stdio import stdio_server
from mcp.shared.message import SessionMessage

from toolservices.mcp._jsonrpc import check_message, rejection
from toolservices.mcp._serving import (
    _CONNECTION,
    CANCEL_SETTLE_TIMEOUT,
    _Calls,
    wait_for_signals,
)

__all__ = ["serve_stdio"]

logger = logging.getLogger(__name__)

#: How long a drained server waits for the answers of requests other than tool calls.
ANSWER_TIMEOUT = 5.0


class _Lines:
    """The client's lines from a private copy of fd 0, read when the loop says it is readable.

    One ``os.read`` after readability never blocks on a pipe, socket or tty,
    so the file description's flags stay untouched.
    """

    def __init__(self, fd: int) -> None:
        self._fd = fd
        self._buffer = bytearray()
        self._scanned = 0  # bytes of the buffer known to hold no newline
        self._eof = False
        self._stopped = False
        self._waiting: anyio.CancelScope | None = None

    def stop(self) -> None:
        """End the lines now (the SDK's reader task then finishes)."""
        self._stopped = True
        if self._waiting is not None:
            self._waiting.cancel()

    def __aiter__(self) -> _Lines:
        return self

    async def __anext__(self) -> str:
        while True:
            end = self._buffer.find(b"\n", self._scanned)  # a long line is scanned once
            if end >= 0 or (self._eof and self._buffer):
                cut = end + 1 if end >= 0 else len(self._buffer)
                line = bytes(self._buffer[:cut])
                del self._buffer[:cut]
                self._scanned = 0
                return line.decode("utf-8", "replace")
            self._scanned = len(self._buffer)
            if self._eof or self._stopped:
                raise StopAsyncIteration
            with anyio.CancelScope() as self._waiting:
                await anyio.wait_readable(self._fd)
            self._waiting = None
            if self._stopped:
                raise StopAsyncIteration
            try:
                chunk = os.read(self._fd, 1 << 16)
            except BlockingIOError:  # someone made the descriptor non-blocking: wait again
                continue
            except OSError as exc:  # EIO and friends: the client's end is gone
                logger.debug("stdin failed (%s): treated as EOF", exc)
                chunk = b""
            if chunk:
                self._buffer += chunk
            else:
                self._eof = True


class _Checked:
    """The client's lines, minus the bad messages: those are answered here (see
    :func:`~toolservices.mcp._jsonrpc.check_message`) and never reach the SDK.
    Blank lines are skipped."""

    def __init__(self, lines: _Lines, rejects: MemoryObjectSendStream[SessionMessage]) -> None:
        self._lines = lines
        self._rejects = rejects

    def stop(self) -> None:
        self._lines.stop()

    def __aiter__(self) -> _Checked:
        return self

    async def __anext__(self) -> str:
        while True:
            line = await self._lines.__anext__()
            if not line.strip():
                continue
            error = check_message(line)
            if error is None:
                return line
            await self._rejects.send(SessionMessage(error))


@contextlib.contextmanager
def _claimed_stdin() -> Iterator[_Lines | None]:
    """fd 0 moved to a private descriptor (fd 0 reads /dev/null meanwhile, so
    children cannot eat the protocol), or ``None`` when stdin is a regular file
    (not pollable: the SDK's own reader is used)."""
    try:
        if stat.S_ISREG(os.fstat(0).st_mode):
            yield None
            return
    except OSError:
        yield None
        return
    private = os.dup(0)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    try:
        yield _Lines(private)
    finally:
        os.dup2(private, 0)
        os.close(private)


class _Answers:
    """Ids of the requests received and not yet answered."""

    def __init__(self) -> None:
        self._pending: set[Any] = set()
        self._done: anyio.Event | None = None

    def received(self, item: SessionMessage | Exception) -> None:
        if isinstance(item, SessionMessage) and isinstance(item.message, mt.JSONRPCRequest):
            self._pending.add(item.message.id)

    def sent(self, item: SessionMessage) -> None:
        if isinstance(item.message, (mt.JSONRPCResponse, mt.JSONRPCError)):
            self._pending.discard(item.message.id)
            if not self._pending and self._done is not None:
                self._done.set()

    async def all_sent(self) -> None:
        if self._pending:
            if self._done is None or self._done.is_set():
                self._done = anyio.Event()
            await self._done.wait()


async def serve_stdio(
    server: Server[Any],
    calls: _Calls,
    *,
    grace: float,
    on_ready: Callable[[str], None] | None,
    signals: tuple[signal.Signals, ...],
) -> None:
    """Serve one client on stdin/stdout until it leaves or a signal asks to stop."""
    answers = _Answers()
    into_send, into_recv = anyio.create_memory_object_stream[SessionMessage | Exception](0)
    out_send, out_recv = anyio.create_memory_object_stream[SessionMessage](0)
    # Answers to bad messages, written beside the server's own (ours need no session).
    rejects_send, rejects_recv = anyio.create_memory_object_stream[SessionMessage](16)
    token = _CONNECTION.set("stdio")  # inherited by every handler task of this connection
    try:
        with _claimed_stdin() as claimed:
            lines = _Checked(claimed, rejects_send) if claimed is not None else None
            async with stdio_server(stdin=lines) as (read, write):  # type: ignore[arg-type]
                if on_ready is not None:
                    on_ready("stdio")
                async with anyio.create_task_group() as tg:
                    inbound = anyio.CancelScope()
                    tg.start_soon(_pump_in, read, into_send, answers, inbound, rejects_send)
                    tg.start_soon(_pump_out, out_recv, write, answers)
                    tg.start_soon(_pump_rejects, rejects_recv, write)
                    first, second = anyio.Event(), anyio.Event()
                    tg.start_soon(wait_for_signals, signals, first, second)

                    async def drain_on_signal() -> None:
                        await first.wait()
                        await calls.drain(grace, second)
                        with anyio.move_on_after(ANSWER_TIMEOUT):
                            await answers.all_sent()
                        inbound.cancel()  # the server sees EOF and ends its session

                    tg.start_soon(drain_on_signal)
                    await server.run(into_recv, out_send, server.create_initialization_options())
                    tg.cancel_scope.cancel()
                if lines is not None:
                    lines.stop()
    finally:
        _CONNECTION.reset(token)


async def _pump_in(
    source: Any,
    sink: MemoryObjectSendStream[SessionMessage | Exception],
    answers: _Answers,
    scope: anyio.CancelScope,
    rejects: MemoryObjectSendStream[SessionMessage],
) -> None:
    async with sink:
        with scope:
            async for item in source:
                if isinstance(item, Exception):  # the SDK's own reader (stdin a regular file)
                    await rejects.send(SessionMessage(rejection(item)))
                    continue
                answers.received(item)
                await sink.send(item)


async def _pump_out(
    source: MemoryObjectReceiveStream[SessionMessage],
    sink: Any,
    answers: _Answers,
) -> None:
    async with sink:
        async for item in source:
            with anyio.move_on_after(CANCEL_SETTLE_TIMEOUT, shield=True):
                await sink.send(item)
            answers.sent(item)


async def _pump_rejects(source: MemoryObjectReceiveStream[SessionMessage], sink: Any) -> None:
    """Write the answers to bad messages (until the server's writer has closed)."""
    async for item in source:
        with anyio.move_on_after(CANCEL_SETTLE_TIMEOUT, shield=True):
            try:
                await sink.send(item)
            except (anyio.ClosedResourceError, anyio.BrokenResourceError):
                return
