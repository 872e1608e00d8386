"""Length-prefixed frames on a private Unix socket.

Every message is ``header + body`` where the header is ``<IIB``: body length,
sequence number and kind. File descriptors ride along with the first byte of a
frame (``SCM_RIGHTS``). The parent checks kind, sequence number and size of
every reply; anything unexpected is a :class:`ProtocolViolation` and the peer
is killed, so one call's reply can never be taken for another's.

The blocking helpers are used by the fork server and the session workers
(single-threaded, nothing else to do while waiting); :class:`AsyncChannel` is
the parent's end and never blocks the event loop.
"""

from __future__ import annotations

import array
import json
import os
import socket
import struct
from dataclasses import dataclass, field
from typing import Any

import anyio

__all__ = [
    "AsyncChannel",
    "Frame",
    "Kind",
    "PeerClosed",
    "ProtocolViolation",
    "recv_frame",
    "send_frame",
]

HEADER = struct.Struct("<IIB")
MAX_FDS = 16
_ANC_SPACE = socket.CMSG_SPACE(MAX_FDS * array.array("i").itemsize)


class Kind:
    """Frame kinds (one byte). Requests and replies never share a value."""

    # parent -> session worker
    EXEC = 1
    FORK = 2
    # session worker -> parent
    HELLO = 10
    RESULT = 11
    FORKED = 12
    # parent -> fork server
    CONFIG = 20
    SPAWN = 21
    KILL = 22
    MKDIRS = 23
    ADOPT = 24
    RELEASE = 25
    # fork server -> parent
    READY = 30
    OK = 31
    ERROR = 32


class ProtocolViolation(Exception):
    """The peer sent something that is not the expected frame."""


class PeerClosed(ProtocolViolation):
    """The peer closed its end (usually: the process died)."""


@dataclass(slots=True)
class Frame:
    kind: int
    seq: int
    body: bytes
    fds: list[int] = field(default_factory=list)

    def json(self) -> Any:
        """Decode the body as JSON; a malformed body is a protocol violation."""
        try:
            return json.loads(self.body)
        except ValueError as exc:
            raise ProtocolViolation(f"malformed frame body: {exc}") from None


def _fds_from_ancdata(ancdata: list[tuple[int, int, bytes]]) -> list[int]:
    fds: list[int] = []
    for level, kind, data in ancdata:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            arr = array.array("i")
            arr.frombytes(data[: len(data) - (len(data) % arr.itemsize)])
            fds.extend(arr)
    return fds


def _ancillary(fds: list[int] | tuple[int, ...]) -> list[tuple[int, int, bytes]]:
    if not fds:
        return []
    return [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds).tobytes())]


# --- blocking side (fork server, session workers) ---------------------------------


def send_frame(
    sock: socket.socket, kind: int, seq: int, body: bytes = b"", fds: tuple[int, ...] = ()
) -> None:
    """Send one frame, blocking until all of it is written."""
    data = HEADER.pack(len(body), seq, kind) + body
    sent = sock.sendmsg([data], _ancillary(fds))
    if sent < len(data):
        sock.sendall(memoryview(data)[sent:])


def _recv_exact(sock: socket.socket, n: int, fds: list[int]) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk, anc, _flags, _addr = sock.recvmsg(n - len(buf), _ANC_SPACE)
        fds.extend(_fds_from_ancdata(anc))
        if not chunk:
            raise PeerClosed("peer closed the channel")
        buf += chunk
    return bytes(buf)


def recv_frame(sock: socket.socket, *, max_body: int) -> Frame:
    """Receive one frame, blocking. Raises :class:`PeerClosed` on EOF."""
    fds: list[int] = []
    length, seq, kind = HEADER.unpack(_recv_exact(sock, HEADER.size, fds))
    if length > max_body:
        raise ProtocolViolation(f"frame of {length} bytes exceeds the limit of {max_body}")
    body = _recv_exact(sock, length, fds) if length else b""
    return Frame(kind, seq, body, fds)


# --- the parent's end ----------------------------------------------------------------


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
        self.closed = False

    def fileno(self) -> int:
        return self.sock.fileno()

    async def send(self, kind: int, seq: int, body: bytes = b"", fds: tuple[int, ...] = ()) -> None:
        data = memoryview(HEADER.pack(len(body), seq, kind) + body)
        anc = _ancillary(fds)
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
            chunk, anc, _flags, _addr = self.sock.recvmsg(1 << 16, _ANC_SPACE)
        except BlockingIOError:
            return False
        except OSError as exc:
            raise PeerClosed(f"cannot read from peer: {exc}") from None
        self._fds.extend(_fds_from_ancdata(anc))
        if not chunk:
            raise PeerClosed("peer closed the channel")
        self._buf += chunk
        return True

    def has_stray_data(self) -> bool:
        """True when the peer sent bytes nobody asked for (or closed the channel)."""
        if self._buf or self._fds:
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
            if not self._pull():
                await anyio.wait_readable(self.sock)

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.sock.close()
            for fd in self._fds:
                _close_quietly(fd)
            self._fds = []


def _close_quietly(fd: int) -> None:
    try:
        os.close(fd)
    except OSError:  # already closed: nothing left to release
        return
