"""The parent's end of a framed channel: awaited on the event loop or used blocking.

:meth:`Channel.request` is the one request/reply exchange of the parent: it
draws the request's random sequence number (:meth:`Channel.next_seq`), bounds
the wait, and checks the reply's kind and number (:func:`check_reply`). The
session's hot path (``SessionHandle.run``) uses the same three pieces split
up, to poll for a quick reply before it awaits.

Waking a sleeping thread or process costs 50-150 us on a small VM, more than
the rest of a round trip. So a receive may first *poll* the socket for a
short, bounded time (``spin``) before it sleeps: a reply that comes back
within that window costs no wake-up at all.

On asyncio (the library's loop) the socket is registered with the loop on
the first wait and stays registered while the channel is only used from the
loop: registering around every wait (what ``anyio.wait_readable`` does)
costs about as much as the rest of a round trip. A channel can also be used
from another thread (the executor's direct path) while no task waits on it:
if the loop then sees it readable, it unregisters it without reading, so the
bytes stay for the thread. Other async backends use ``anyio.wait_readable``.
"""

from __future__ import annotations

import asyncio
import os
import select
import socket
import time

import anyio

from toolservices.errors import InfrastructureError
from toolservices.python.host._gate import on_loop
from toolservices.python.runtime import (
    ANC_SPACE,
    HEADER,
    Frame,
    Message,
    PeerClosed,
    ProtocolViolation,
    ancillary,
    fds_from_ancdata,
    new_seq,
)

__all__ = ["Channel", "Outgoing", "check_reply", "out_of_descriptors"]

#: the unsent rest of a frame and the descriptors still to go with its first byte
Outgoing = tuple[memoryview, list[tuple[int, int, bytes]]]


def out_of_descriptors(detail: str) -> InfrastructureError:
    """This process ran out of file descriptors (``EMFILE``): what to change, retryable."""
    return InfrastructureError(
        f"no file descriptor left for a new session ({detail}): each live session holds "
        "a few in this process; lower max_sessions or raise the open-files limit (ulimit -n)",
        retryable=True,
    )


_POLL_EVENTS = select.POLLIN | select.POLLPRI | select.POLLHUP | select.POLLERR


class Channel:
    """The parent's end of a channel: a non-blocking socket, one request/reply at a time.

    Callers serialise their use (a lock per session). Bytes that arrive when
    no frame is expected are reported by :meth:`has_stray_data` so the caller
    can treat them as a violation.
    """

    def __init__(self, sock: socket.socket, *, max_body: int) -> None:
        sock.setblocking(False)
        self.sock = sock
        self.max_body = max_body
        self._buf = bytearray()
        self._fds: list[int] = []
        self._error: PeerClosed | InfrastructureError | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._waiter: asyncio.Future[None] | None = None
        self.closed = False
        self.seq = 0  # the last request's sequence number

    def next_seq(self) -> int:
        """A fresh random sequence number for the next request (see ``new_seq``)."""
        self.seq = new_seq(self.seq)
        return self.seq

    async def request(
        self,
        message: Message,
        *,
        expect: tuple[int, ...],
        timeout: float | None,  # noqa: ASYNC109 - the reply's bound, owned here
        fds: tuple[int, ...] = (),
    ) -> Frame:
        """Send ``message`` under a new sequence number; its reply, of one of the ``expect`` kinds.

        Raises :class:`ProtocolViolation` for any other frame (or a dead peer)
        and :class:`TimeoutError` when no reply came within ``timeout`` seconds
        (None: the caller's own scope bounds it).
        """
        seq = self.next_seq()
        await self.send(message.KIND, seq, message.body(), fds)
        with anyio.fail_after(timeout):
            frame = await self.recv()
        check_reply(frame, seq, expect)
        return frame

    def fileno(self) -> int:
        return self.sock.fileno()

    # --- sending ---------------------------------------------------------------------

    def _send_some(self, data: memoryview, anc: list[tuple[int, int, bytes]]) -> memoryview:
        """Write what the socket takes now; the rest of ``data``."""
        try:
            sent = self.sock.sendmsg([data], anc) if anc else self.sock.send(data)
        except BlockingIOError:
            return data
        except OSError as exc:  # EPIPE, ECONNRESET: the peer is gone
            raise PeerClosed(f"cannot write to peer: {exc}") from None
        return data[sent:]

    def start_send(
        self, kind: int, seq: int, body: bytes = b"", fds: tuple[int, ...] = ()
    ) -> Outgoing:
        """Write as much of a frame as the socket takes now; the rest for :meth:`finish_send`."""
        data = memoryview(HEADER.pack(len(body), seq, kind) + body)
        anc = ancillary(fds)
        rest = self._send_some(data, anc)
        return rest, (anc if len(rest) == len(data) else [])

    async def finish_send(self, outgoing: Outgoing) -> None:
        """Write the rest of a frame begun with :meth:`start_send` (nothing if none is left)."""
        data, anc = outgoing
        while data:
            await anyio.wait_writable(self.sock)
            rest = self._send_some(data, anc)
            if len(rest) < len(data):
                anc = []  # the descriptors went with the first byte
            data = rest

    async def send(self, kind: int, seq: int, body: bytes = b"", fds: tuple[int, ...] = ()) -> None:
        await self.finish_send(self.start_send(kind, seq, body, fds))

    def send_blocking(self, kind: int, seq: int, body: bytes, *, deadline: float) -> bool:
        """Send one frame from any thread; False if ``deadline`` (monotonic) passed first."""
        data = memoryview(HEADER.pack(len(body), seq, kind) + body)
        while data := self._send_some(data, []):
            if not self._wait_fd(select.POLLOUT, deadline):
                return False
        return True

    # --- receiving -------------------------------------------------------------------

    def _pull(self) -> bool:
        """Read what is available without blocking; False when nothing was."""
        try:
            chunk, anc, flags, _addr = self.sock.recvmsg(1 << 16, ANC_SPACE)
        except BlockingIOError:
            return False
        except OSError as exc:
            raise PeerClosed(f"cannot read from peer: {exc}") from None
        self._fds.extend(fds_from_ancdata(anc))
        if flags & socket.MSG_CTRUNC:  # the kernel dropped descriptors we had no room for
            for fd in self._fds:
                os.close(fd)
            self._fds = []
            raise out_of_descriptors("descriptors sent to us were dropped")
        if not chunk:
            raise PeerClosed("peer closed the channel")
        self._buf += chunk
        return True

    def _take_frame(self) -> Frame | None:
        """The next complete frame in the buffer, if there is one."""
        if len(self._buf) < HEADER.size:
            return None
        length, seq, kind = HEADER.unpack_from(self._buf)
        if length > self.max_body:
            raise ProtocolViolation(f"frame of {length} bytes exceeds the limit of {self.max_body}")
        end = HEADER.size + length
        if len(self._buf) < end:
            return None
        body = bytes(self._buf[HEADER.size : end])
        del self._buf[:end]
        fds, self._fds = self._fds, []
        return Frame(kind, seq, body, fds)

    def poll(self, spin: float = 0.0) -> Frame | None:
        """A frame if one is (or, within ``spin`` seconds, becomes) available; never sleeps."""
        end = time.perf_counter() + spin if spin > 0 else 0.0
        while True:
            frame = self._take_frame()
            if frame is not None:
                return frame
            if self._error is not None:
                raise self._error
            if not self._pull():
                if time.perf_counter() >= end:
                    return None
                os.sched_yield()  # the peer may be waiting for this very CPU

    async def recv(self, *, spin: float = 0.0) -> Frame:
        """Wait for the next complete frame (polling up to ``spin`` seconds first)."""
        frame = self.poll(spin)
        while frame is None:
            await self._wait()
            frame = self.poll()
        return frame

    def recv_blocking(self, *, deadline: float, spin: float = 0.0) -> Frame | None:
        """The next frame, waiting in this thread; None if ``deadline`` (monotonic) passed."""
        frame = self.poll(spin)
        while frame is None:
            if not self._wait_fd(_POLL_EVENTS, deadline):
                return None
            frame = self.poll()
        return frame

    def has_stray_data(self) -> bool:
        """True when the peer sent bytes nobody asked for (or closed the channel)."""
        if self._buf or self._fds or self._error is not None:
            return True
        try:
            return self._pull()
        except PeerClosed:
            return True

    # --- waiting ---------------------------------------------------------------------

    def _wait_fd(self, events: int, deadline: float) -> bool:
        """Block this thread until the socket is ready; False at the deadline."""
        poller = select.poll()
        poller.register(self.sock.fileno(), events)
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            if poller.poll(max(1, int(remaining * 1000 + 0.999))):
                return True

    def _on_readable(self) -> None:
        """Loop callback: fill the buffer for the waiting task, or step aside."""
        waiter = self._waiter
        if waiter is None:  # nobody awaits: a thread may own the channel, leave its bytes
            self._unregister()
            return
        try:
            self._pull()
        except (PeerClosed, InfrastructureError) as exc:  # the waiting task raises it
            self._error = exc
            self._unregister()
        if not waiter.done():
            waiter.set_result(None)

    def _unregister(self) -> None:
        loop, self._loop = self._loop, None
        if loop is not None and not loop.is_closed():
            loop.remove_reader(self.sock.fileno())

    async def _wait(self) -> None:
        """Until more data (or EOF) arrived."""
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # another backend
            await anyio.wait_readable(self.sock)
            return
        self._waiter = loop.create_future()
        if self._loop is None:
            self._loop = loop
            loop.add_reader(self.sock.fileno(), self._on_readable)
        try:
            await self._waiter
        finally:
            self._waiter = None

    def close(self) -> None:
        """Close the socket; from another thread, the loop it is registered with does it."""
        if self.closed:
            return
        self.closed = True
        loop = self._loop
        if loop is not None and loop.is_running() and not on_loop(loop):
            loop.call_soon_threadsafe(self._release)  # a finalizer, or the direct path
        else:
            self._release()

    def _release(self) -> None:
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


def check_reply(frame: Frame, seq: int, expect: tuple[int, ...]) -> None:
    """:class:`ProtocolViolation` unless ``frame`` answers request ``seq``, of a kind in ``expect``.

    Descriptors that came with a rejected frame are closed.
    """
    if frame.kind not in expect or frame.seq != seq:
        for fd in frame.fds:
            _close_quietly(fd)
        raise ProtocolViolation(f"unexpected reply kind {frame.kind} seq {frame.seq}")
