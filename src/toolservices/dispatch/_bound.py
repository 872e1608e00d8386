"""What a dispatcher owns across every caller: its concurrency bound and abandoned threads.

A :class:`~toolservices.Dispatcher` can be called from many places at once:
concurrent ``arun`` calls on one loop, the shared background loop (its
sync ``run``), a user's own ``asyncio.run`` in another thread, and the
dispatchers derived from it (``with_options``, an episode's own tools).
Its ``max_concurrency`` must hold over all of them, so the bound cannot be
an ``anyio.CapacityLimiter`` (whose waiters belong to one event loop) nor
be made per ``arun`` call. :class:`Limits` is that one owner: a
:class:`ConcurrencyBound` guarded by a thread lock, whose waiters are woken
on their own loop, and the per-tool counts of calls abandoned in threads.
"""

from __future__ import annotations

import asyncio
import collections
import threading
from collections.abc import Iterable
from typing import Any

import anyio

from toolservices.tools.base import Tool

__all__ = ["ConcurrencyBound", "Limits"]


class _Waiter:
    __slots__ = ("future", "granted", "loop")

    def __init__(self, loop: asyncio.AbstractEventLoop, future: asyncio.Future[None]) -> None:
        self.loop = loop
        self.future = future
        self.granted = False


class ConcurrencyBound:
    """At most ``total`` holders at once, whatever thread or asyncio loop they run on.

    Tokens go to waiters in the order they asked (first come, first served,
    over all loops). A free token is taken without yielding to the loop.
    With ``total=1`` it is a mutex any loop can wait on (an episode orders
    the calls a trainer hands it with one).
    """

    def __init__(self, total: int) -> None:
        self.total = total
        self._lock = threading.Lock()
        self._held = 0
        self._waiters: collections.deque[_Waiter] = collections.deque()

    def __reduce__(self) -> tuple[Any, ...]:
        # a copy (deepcopy, pickle to another process) is a fresh bound of the same size:
        # tokens and waiters belong to the callers of this one
        return (ConcurrencyBound, (self.total,))

    @property
    def held(self) -> int:
        """Tokens taken now."""
        return self._held

    @property
    def waiting(self) -> int:
        """Callers waiting for a token now."""
        return len(self._waiters)

    def try_acquire(self) -> bool:
        """Take a token if one is free and nobody waits; never blocks."""
        with self._lock:
            if self._held < self.total and not self._waiters:
                self._held += 1
                return True
            return False

    async def acquire(self) -> None:
        """Take a token, waiting on the running asyncio loop for one to be released."""
        loop = asyncio.get_running_loop()
        with self._lock:
            if self._held < self.total and not self._waiters:
                self._held += 1
                return
            waiter = _Waiter(loop, loop.create_future())
            self._waiters.append(waiter)
        try:
            await waiter.future
        except BaseException:
            with self._lock:
                granted = waiter.granted
                if not granted:
                    self._waiters.remove(waiter)
            if granted:  # handed a token while being cancelled: pass it on
                self.release()
            raise

    def release(self) -> None:
        """Give a token back: to the first waiter still waiting, else to the pool."""
        while True:
            with self._lock:
                if not self._waiters:
                    self._held -= 1
                    return
                waiter = self._waiters.popleft()
                waiter.granted = True  # the token moves to it; held is unchanged
            try:
                waiter.loop.call_soon_threadsafe(_wake, waiter.future)
                return
            except RuntimeError:  # its loop is closed: nobody is left to take the token
                continue


def _wake(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


class Limits:
    """One dispatcher's shared state: its bound and its tools' abandoned-thread counts.

    Shared by every dispatcher derived from it. A count goes up when a sync
    call is abandoned at its timeout while its thread runs on, and down when
    that thread ends; the condition is notified whenever a count drops.
    """

    def __init__(self, *, max_concurrency: int, max_abandoned_threads: int) -> None:
        self.bound = ConcurrencyBound(max_concurrency)
        #: Sizes anyio's worker threads for sync tools. Every holder of one of its
        #: tokens holds one of the bound's first, so it never waits (and so never
        #: binds itself to a loop): at most ``max_concurrency`` threads at once.
        self.threads = anyio.CapacityLimiter(max_concurrency)
        self.max_abandoned_threads = max_abandoned_threads
        self.abandoned_changed = threading.Condition()
        self._abandoned: dict[int, tuple[Tool, int]] = {}

    def __reduce__(self) -> tuple[Any, ...]:
        # a copy owns its own bound and counts (the threads counted here are this owner's)
        return (_fresh_limits, (self.bound.total, self.max_abandoned_threads))

    def abandoned(self, tool: Tool) -> int:
        """Calls of ``tool`` abandoned by this owner's dispatchers and still running."""
        with self.abandoned_changed:
            entry = self._abandoned.get(id(tool))
            return entry[1] if entry is not None and entry[0] is tool else 0

    def admit(self, tool: Tool) -> bool:
        """Whether a new call of ``tool`` may start (it has fewer than the cap abandoned)."""
        return self.abandoned(tool) < self.max_abandoned_threads

    def add_abandoned(self, tool: Tool, delta: int) -> int:
        """Change ``tool``'s count by ``delta``; the new count (hold :attr:`abandoned_changed`)."""
        entry = self._abandoned.get(id(tool))
        count = (entry[1] if entry is not None and entry[0] is tool else 0) + delta
        if count:
            self._abandoned[id(tool)] = (tool, count)
        else:
            self._abandoned.pop(id(tool), None)
        if delta < 0:
            self.abandoned_changed.notify_all()
        return count

    def wait_abandoned(self, tools: Iterable[Tool], timeout: float | None) -> bool:
        """Block until no tool of ``tools`` has abandoned calls left; False on timeout."""
        tools = list(tools)
        with self.abandoned_changed:
            return self.abandoned_changed.wait_for(
                lambda: not any(id(t) in self._abandoned for t in tools), timeout
            )


def _fresh_limits(max_concurrency: int, max_abandoned_threads: int) -> Limits:
    return Limits(max_concurrency=max_concurrency, max_abandoned_threads=max_abandoned_threads)
