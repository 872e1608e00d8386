"""The wire protocol: length-prefixed frames on a private Unix socket, one typed message each.

Every message is ``header + body`` where the header is ``<IIB``: body length,
sequence number and kind. File descriptors ride along with the first byte of a
frame (``SCM_RIGHTS``). The parent checks kind, sequence number and size of
every reply; anything unexpected is a :class:`ProtocolViolation` and the peer
is killed, so one call's reply can never be taken for another's.

Each frame kind has one message class here (:data:`MESSAGES`): what its body
holds, how it is encoded and how it is checked when decoded. Sequence
numbers are drawn at random per request (:func:`new_seq`); a reply carries
its request's number.

The blocking helpers here are used by the fork server and the session workers
(single-threaded, nothing else to do while waiting); the parent's end is
:class:`toolservices.python.host._channel.Channel`, whose ``request`` owns the
sequence numbers and timeouts of the parent's requests. Like the whole
runtime package this module imports only the standard library.
"""

from __future__ import annotations

import array
import json
import os
import socket
import struct
from dataclasses import dataclass, field
from typing import Any, ClassVar, TypeVar

__all__ = [
    "EXIT_BROKEN",
    "HEADER",
    "MESSAGES",
    "Adopt",
    "Config",
    "Discard",
    "Error",
    "Exec",
    "Fork",
    "Forked",
    "Frame",
    "Hello",
    "Kill",
    "Kind",
    "Message",
    "Mkdirs",
    "Ok",
    "PeerClosed",
    "ProtocolViolation",
    "Ready",
    "Release",
    "Result",
    "Spawn",
    "decode",
    "new_seq",
    "recv_frame",
    "send_frame",
    "send_message",
]

HEADER = struct.Struct("<IIB")
#: a session worker's exit status when the code broke its machinery (channel, output files)
EXIT_BROKEN = 70
#: a call may leave a callable under this name in the session's globals: the worker runs it
#: once, after the reply is sent and before it reads the next request (work the caller need
#: not wait for: the shell supervisor takes a command's saved state there). It must not
#: raise: a hook that does ends the session (EXIT_BROKEN; the host reports the loss).
AFTER_REPLY = "__toolservices_after_reply__"
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


def send_message(
    sock: socket.socket, message: Message, seq: int, fds: tuple[int, ...] = ()
) -> None:
    """Send one typed message, blocking (the runtime's side)."""
    send_frame(sock, message.KIND, seq, message.body(), fds)


def new_seq(previous: int) -> int:
    """A random, non-zero 32-bit sequence number unlike ``previous``.

    User code can write on its session's channel. A counter would let it
    forge, during one call, the reply to a later one (a background thread
    sending it once the next call has started); a number drawn when the
    request is sent cannot be known by anything written before it.
    """
    while True:  # os.urandom, as secrets.randbits does (without its imports: hashlib...)
        seq = int.from_bytes(os.urandom(4), "little")
        if seq not in (0, previous):
            return seq


# --- typed messages: one per frame kind -------------------------------------------

_dumps = json.dumps  # bound once: user code that patches json must not break the worker
M = TypeVar("M", bound="Message")


@dataclass
class Message:
    """A frame's body as a typed object; the body on the wire is JSON of its fields."""

    KIND: ClassVar[int]

    def body(self) -> bytes:
        return _dumps(self.__dict__).encode()  # a dataclass's fields, in order (no slots)

    @classmethod
    def decode(cls: type[M], frame: Frame) -> M:
        """The message a frame of this kind carries; :class:`ProtocolViolation` if malformed."""
        if frame.kind != cls.KIND:
            raise ProtocolViolation(f"expected a {cls.__name__} frame, got kind {frame.kind}")
        data = frame.json()
        if not isinstance(data, dict):
            raise ProtocolViolation(f"a {cls.__name__} body must be an object")
        try:
            return cls(**data)
        except TypeError as exc:
            raise ProtocolViolation(f"malformed {cls.__name__}: {exc}") from None


@dataclass
class Exec(Message):
    """parent -> session: run ``code`` (the body is the source itself, not JSON)."""

    KIND = Kind.EXEC
    code: str

    def body(self) -> bytes:
        return self.code.encode("utf-8", "surrogatepass")

    @classmethod
    def decode(cls, frame: Frame) -> Exec:
        return cls(frame.body.decode("utf-8", "surrogatepass"))


@dataclass
class Fork(Message):
    """parent -> session: fork into one copy per attached channel end, working in ``workdirs``."""

    KIND = Kind.FORK
    workdirs: list[str]
    source: str | None = None


@dataclass
class Hello(Message):
    """session -> parent, unsolicited (seq 0): its pid; its two output memfds are attached."""

    KIND = Kind.HELLO
    pid: int


@dataclass
class Result(Message):
    """session -> parent: how a call ended (``fatal``: the code broke the worker, it exits)."""

    KIND = Kind.RESULT
    rc: int = 0
    exc: dict[str, str] | None = None
    dur: float = 0.0
    dropped: list[int] = field(default_factory=lambda: [0, 0])
    fatal: str | None = None


@dataclass
class Forked(Message):
    """session -> parent: ``n`` copies were made (each says HELLO on its own channel)."""

    KIND = Kind.FORKED
    n: int


@dataclass
class Config(Message):
    """parent -> fork server, first frame: what every session gets.

    ``preload_code``: source run once after ``preload`` is imported, before any fork.
    """

    KIND = Kind.CONFIG
    max_output: int
    busy_poll: float = 0.0
    preload: list[str] = field(default_factory=list)
    preload_code: str = ""


@dataclass
class Spawn(Message):
    """parent -> fork server: fork a session onto the attached channel end.

    ``seed``: the workdir of a live session whose files the new one starts with.
    ``root``: an image as this session's root instead of the launch state's
    (``{"layers": [...top first], "env": {name: value or None to unset}}``);
    a seeded session takes its source's.
    """

    KIND = Kind.SPAWN
    seed: str | None = None
    root: dict[str, Any] | None = None


@dataclass
class Kill(Message):
    """parent -> fork server: kill a session's tree, reap it, delete its directory."""

    KIND = Kind.KILL
    workdir: str


@dataclass
class Discard(Message):
    """parent -> fork server: like :class:`Kill`, without waiting for the reaping."""

    KIND = Kind.DISCARD
    workdir: str


@dataclass
class Mkdirs(Message):
    """parent -> fork server: ``n`` working directories in the lineage of session ``src``."""

    KIND = Kind.MKDIRS
    n: int
    src: str


@dataclass
class Adopt(Message):
    """parent -> fork server: register copies made by ``fork_session`` (``[pid, workdir]``)."""

    KIND = Kind.ADOPT
    sessions: list[list[Any]]


@dataclass
class Release(Message):
    """parent -> fork server: delete directories from :class:`Mkdirs` that nobody adopted."""

    KIND = Kind.RELEASE
    workdirs: list[str]


@dataclass
class Ready(Message):
    """fork server -> parent: started, with the preloads that failed."""

    KIND = Kind.READY
    pid: int
    preload_failed: dict[str, str] = field(default_factory=dict)
    python: str = ""


@dataclass
class Ok(Message):
    """fork server -> parent: a request succeeded; what it returns depends on the request."""

    KIND = Kind.OK
    workdir: str | None = None
    pid: int | None = None
    status: int | None = None
    workdirs: list[str] | None = None


@dataclass
class Error(Message):
    """fork server or session -> parent: a request failed (the server keeps serving)."""

    KIND = Kind.ERROR
    error: str


MESSAGES: dict[int, type[Message]] = {
    cls.KIND: cls
    for cls in (
        Exec,
        Fork,
        Hello,
        Result,
        Forked,
        Config,
        Spawn,
        Kill,
        Discard,
        Mkdirs,
        Adopt,
        Release,
        Ready,
        Ok,
        Error,
    )
}


def decode(frame: Frame) -> Message:
    """The typed message in ``frame``; :class:`ProtocolViolation` for an unknown kind."""
    cls = MESSAGES.get(frame.kind)
    if cls is None:
        raise ProtocolViolation(f"unknown frame kind {frame.kind}")
    return cls.decode(frame)
