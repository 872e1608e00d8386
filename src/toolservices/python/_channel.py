"""The parent's end of a framed channel, driven by the event loop.

On asyncio (the library's shared loop) the socket stays registered with the
loop for the channel's life and a callback fills the buffer: registering and
unregistering it around every wait (what ``anyio.wait_readable`` does) costs
about as much as the rest of a round trip. Other backends use
``anyio.wait_readable``.
"""

from __future__ import annotations

import asyncio
import os
import socket

import anyio

from toolservices.python._frames import (
    ANC_SPACE,
    HEADER,
    Frame,
    PeerClosed,
    ProtocolViolation,
    ancillary,
    fds_from_ancdata,
)

__all__ = ["AsyncChannel"]


class AsyncChannel:
    """The parent's end of a channel: non-blocking socket driven by the event loop.

    One request/reply at a time (callers hold a lock); bytes that arrive when
    no frame is expected are left in the buffer and reported by
    :meth:`has_stray_data` so the caller can treat them as a violation.
    """

    def __init__(self, sock: socket.socket, *, max_body: int) -> None:
        sock.setblocking(False)
        self.sock = sock
        self.max_body = max_body
        self._buf = bytearray()
        self._fds: list[int] = []
        self._error: PeerClosed | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._waiter: asyncio.Future[None] | None = None
        self.closed = False

    def fileno(self) -> int:
        return self.sock.fileno()

    async def send(self, kind: int, seq: int, body: bytes = b"", fds: tuple[int, ...] = ()) -> None:
        data = memoryview(HEADER.pack(len(body), seq, kind) + body)
        anc = ancillary(fds)
        while data:
            try:
                sent = self.sock.sendmsg([data], anc) if anc else self.sock.send(data)
            except BlockingIOError:
                await anyio.wait_writable(self.sock)
                continue
            except OSError as exc:  # EPIPE, ECONNRESET: the peer is gone
                raise PeerClosed(f"cannot write to peer: {exc}") from None
            anc = []
            data = data[sent:]

    def _pull(self) -> bool:
        """Read what is available without blocking; False when nothing was."""
        try:
            chunk, anc, _flags, _addr = self.sock.recvmsg(1 << 16, ANC_SPACE)
        except BlockingIOError:
            return False
        except OSError as exc:
            raise PeerClosed(f"cannot read from peer: {exc}") from None
        self._fds.extend(fds_from_ancdata(anc))
        if not chunk:
            raise PeerClosed("peer closed the channel")
        self._buf += chunk
        return True

    def _on_readable(self) -> None:
        """Loop callback: move what arrived into the buffer, wake the waiter."""
        try:
            self._pull()
        except PeerClosed as exc:
            self._error = exc
            self._unregister()
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def _unregister(self) -> None:
        if self._loop is not None:
            self._loop.remove_reader(self.sock.fileno())
            self._loop = None

    async def _wait(self) -> None:
        """Until more data (or EOF) arrived."""
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # another backend
            await anyio.wait_readable(self.sock)
            return
        if self._loop is None:
            self._loop = loop
            loop.add_reader(self.sock.fileno(), self._on_readable)
        self._waiter = loop.create_future()
        try:
            await self._waiter
        finally:
            self._waiter = None

    def has_stray_data(self) -> bool:
        """True when the peer sent bytes nobody asked for (or closed the channel)."""
        if self._buf or self._fds or self._error is not None:
            return True
        try:
            return self._pull()
        except PeerClosed:
            return True

    async def recv(self) -> Frame:
        """Wait for the next complete frame."""
        while True:
            if len(self._buf) >= HEADER.size:
                length, seq, kind = HEADER.unpack_from(self._buf)
                if length > self.max_body:
                    raise ProtocolViolation(
                        f"frame of {length} bytes exceeds the limit of {self.max_body}"
                    )
                end = HEADER.size + length
                if len(self._buf) >= end:
                    body = bytes(self._buf[HEADER.size : end])
                    del self._buf[:end]
                    fds, self._fds = self._fds, []
                    return Frame(kind, seq, body, fds)
            if self._error is not None:
                raise self._error
            if not self._pull():
                await self._wait()

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self._unregister()
            self.sock.close()
            for fd in self._fds:
                _close_quietly(fd)
            self._fds = []


def _close_quietly(fd: int) -> None:
    try:
        os.close(fd)
    except OSError:  # already closed: nothing left to release
        return
