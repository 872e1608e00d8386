"""Length-prefixed frames on a private Unix socket.

Every message is ``header + body`` where the header is ``<IIB``: body length,
sequence number and kind. File descriptors ride along with the first byte of a
frame (``SCM_RIGHTS``). The parent checks kind, sequence number and size of
every reply; anything unexpected is a :class:`ProtocolViolation` and the peer
is killed, so one call's reply can never be taken for another's.

The blocking helpers here are used by the fork server and the session workers
(single-threaded, nothing else to do while waiting); the parent's end is
:class:`toolservices.python._channel.Channel`. This module and the
other server-side ones (``_worker``, ``_forkserver``) import only the standard
library: the fork server loads them by path, so that it (and every session
forked from it) does not carry the rest of the package.
"""

from __future__ import annotations

import array
import json
import socket
import struct
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "EXIT_BROKEN",
    "HEADER",
    "Frame",
    "Kind",
    "PeerClosed",
    "ProtocolViolation",
    "recv_frame",
    "send_frame",
]

HEADER = struct.Struct("<IIB")
#: a session worker's exit status when the code broke its machinery (channel, output files)
EXIT_BROKEN = 70
MAX_FDS = 16
ANC_SPACE = socket.CMSG_SPACE(MAX_FDS * array.array("i").itemsize)


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
    DISCARD = 26
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


def fds_from_ancdata(ancdata: list[tuple[int, int, bytes]]) -> list[int]:
    fds: list[int] = []
    for level, kind, data in ancdata:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            arr = array.array("i")
            arr.frombytes(data[: len(data) - (len(data) % arr.itemsize)])
            fds.extend(arr)
    return fds


def ancillary(fds: list[int] | tuple[int, ...]) -> list[tuple[int, int, bytes]]:
    if not fds:
        return []
    return [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds).tobytes())]


# --- blocking side (fork server, session workers) ---------------------------------


def send_frame(
    sock: socket.socket, kind: int, seq: int, body: bytes = b"", fds: tuple[int, ...] = ()
) -> None:
    """Send one frame, blocking until all of it is written."""
    data = HEADER.pack(len(body), seq, kind) + body
    sent = sock.sendmsg([data], ancillary(fds))
    if sent < len(data):
        sock.sendall(memoryview(data)[sent:])


def _recv_exact(sock: socket.socket, n: int, fds: list[int]) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk, anc, _flags, _addr = sock.recvmsg(n - len(buf), ANC_SPACE)
        fds.extend(fds_from_ancdata(anc))
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
