"""Admission: a bounded queue served round-robin per client, so one trainer cannot
starve another, and a bounded wait, so every request is answered in time (504 when not:
the status verl's client retries)."""

from __future__ import annotations

import asyncio
from collections import deque

__all__ = ["Admission"]


class Admission:
    """At most ``concurrency`` requests run; up to ``max_queue`` wait, each at most ``max_wait`` s.

    Waiting requests are admitted one client at a time in turn (round robin over the
    clients that have requests waiting), first come first served within a client.
    Runs on one event loop; no locks needed.
    """

    def __init__(self, *, concurrency: int, max_queue: int, max_wait: float) -> None:
        self.concurrency = concurrency
        self.max_queue = max_queue
        self.max_wait = max_wait
        self.running = 0
        self.rejected = 0
        self._queues: dict[str, deque[asyncio.Future[None]]] = {}
        self._turns: deque[str] = deque()

    @property
    def waiting(self) -> int:
        return sum(len(q) for q in self._queues.values())

    async def enter(self, client: str, max_wait: float | None = None) -> bool:
        """Wait for a slot (at most ``max_wait`` s, else ``self.max_wait``): True when
        admitted (call :meth:`leave` after), False to answer 504."""
        if self.running < self.concurrency and not self._turns:
            self.running += 1
            return True
        if self.waiting >= self.max_queue:
            self.rejected += 1
            return False
        slot: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        queue = self._queues.get(client)
        if queue is None:
            queue = self._queues[client] = deque()
            self._turns.append(client)
        queue.append(slot)
        try:
            await asyncio.wait_for(
                asyncio.shield(slot), self.max_wait if max_wait is None else max_wait
            )
        except asyncio.TimeoutError:
            if slot.done():  # granted at the very moment the wait ended: keep it
                return True
            self._drop(client, slot)
            self.rejected += 1
            return False
        except asyncio.CancelledError:
            if slot.done():
                self.leave()
            else:
                self._drop(client, slot)
            raise
        return True

    def _drop(self, client: str, slot: asyncio.Future[None]) -> None:
        queue = self._queues.get(client)
        if queue is not None and slot in queue:
            queue.remove(slot)
            if not queue:
                del self._queues[client]
                self._turns.remove(client)
        slot.cancel()

    def leave(self) -> None:
        """Free a slot and hand it to the next client in turn."""
        self.running -= 1
        while self._turns and self.running < self.concurrency:
            client = self._turns.popleft()
            queue = self._queues[client]
            slot = queue.popleft()
            if queue:
                self._turns.append(client)
            else:
                del self._queues[client]
            slot.set_result(None)
            self.running += 1
