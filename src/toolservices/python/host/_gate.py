"""A counting lock that the event loop awaits and other threads take without waiting.

The executor's scheduling state (one lock per session, ``pool_size``
execution slots) lives on the library's event loop, but synchronous callers
skip the loop when a session is idle (see ``PythonExecutorService.execute``):
two thread hand-offs cost more than the whole round trip on a small VM. So the
primitive must be safe from any thread. anyio's and asyncio's locks are not,
hence this one: a ``threading.Lock`` guards a counter and a FIFO of waiting
loop futures; a release from any thread hands the token straight to the first
waiter, so a thread can never barge in ahead of a task that queued first.
"""

from __future__ import annotations

import asyncio
import threading
from collections import deque
from types import TracebackType

__all__ = ["Gate", "on_loop"]


class _Waiter:
    __slots__ = ("future", "granted")

    def __init__(self, future: asyncio.Future[None]) -> None:
        self.future = future
        self.granted = False


def _wake(future: asyncio.Future[None]) -> None:
    if not future.done():  # a cancelled waiter passes its token on itself
        future.set_result(None)


class Gate:
    """Up to ``capacity`` holders at once.

    :meth:`acquire` is awaited on the event loop it was first used on;
    :meth:`try_acquire` and :meth:`release` work from any thread.
    """

    def __init__(self, capacity: int = 1) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be at least 1, got {capacity}")
        self.capacity = capacity
        self._free = capacity
        self._mutex = threading.Lock()
        self._waiters: deque[_Waiter] = deque()
        self._loop: asyncio.AbstractEventLoop | None = None

    @property
    def in_use(self) -> int:
        """Tokens held right now."""
        return self.capacity - self._free

    @property
    def waiting(self) -> int:
        return len(self._waiters)

    def locked(self) -> bool:
        """True when no token is free (or tasks are queued for one)."""
        return self._free == 0 or bool(self._waiters)

    def try_acquire(self) -> bool:
        """Take a token if one is free and nobody queued first (any thread)."""
        with self._mutex:
            if self._free and not self._waiters:
                self._free -= 1
                return True
            return False

    async def acquire(self) -> None:
        """Wait for a token (FIFO). Cancellation while queued gives nothing up."""
        loop = asyncio.get_running_loop()
        with self._mutex:
            if self._free and not self._waiters:
                self._free -= 1
                return
            self._loop = loop
            waiter = _Waiter(loop.create_future())
            self._waiters.append(waiter)
        try:
            await waiter.future
        except BaseException:
            with self._mutex:
                if not waiter.granted:
                    self._waiters.remove(waiter)
                    raise
            self.release()  # granted just as we were cancelled: pass it on
            raise

    def release(self) -> None:
        """Give a token back; the first queued task gets it (any thread)."""
        with self._mutex:
            if not self._waiters:
                if self._free >= self.capacity:
                    raise RuntimeError("Gate released more often than acquired")
                self._free += 1
                return
            waiter = self._waiters.popleft()
            waiter.granted = True
            loop = self._loop
        assert loop is not None
        if loop.is_closed():  # the library is shutting down: nobody is left to wake
            return
        if on_loop(loop):
            _wake(waiter.future)
        else:
            loop.call_soon_threadsafe(_wake, waiter.future)

    async def __aenter__(self) -> None:
        await self.acquire()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.release()


def on_loop(loop: asyncio.AbstractEventLoop) -> bool:
    """True when called from inside ``loop`` (in its thread, while it runs)."""
    try:
        return asyncio.get_running_loop() is loop
    except RuntimeError:
        return False
