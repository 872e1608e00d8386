"""The executor's thread-safe gate: FIFO hand-off between loop tasks and threads."""

from __future__ import annotations

import asyncio
import threading

import pytest
from tests._wait import until

from toolservices.python.host._gate import Gate


async def test_tasks_get_the_token_in_arrival_order() -> None:
    gate = Gate(1)
    await gate.acquire()
    order: list[int] = []

    async def take(k: int) -> None:
        async with gate:
            order.append(k)
            await asyncio.sleep(0)

    tasks = [asyncio.create_task(take(k)) for k in range(5)]
    await until(lambda: gate.waiting == 5)  # every task has queued up
    gate.release()
    await asyncio.gather(*tasks)
    assert order == [0, 1, 2, 3, 4]
    assert gate.in_use == 0 and not gate.locked()


async def test_a_thread_cannot_barge_ahead_of_a_queued_task() -> None:
    gate = Gate(1)
    await gate.acquire()
    waiter = asyncio.create_task(gate.acquire())
    await until(lambda: gate.waiting == 1)
    gate.release()  # handed to the queued task, not made free
    barged = await asyncio.to_thread(gate.try_acquire)
    await waiter
    assert not barged and gate.in_use == 1
    gate.release()
    assert await asyncio.to_thread(gate.try_acquire)


async def test_release_from_a_thread_wakes_the_loop_waiter() -> None:
    gate = Gate(2)
    assert gate.try_acquire() and gate.try_acquire()
    waiter = asyncio.create_task(gate.acquire())
    await until(lambda: gate.waiting == 1)
    thread = threading.Thread(target=gate.release)
    thread.start()
    await asyncio.wait_for(waiter, 5)
    thread.join()
    assert gate.in_use == 2


async def test_a_cancelled_waiter_gives_nothing_up_and_passes_a_grant_on() -> None:
    gate = Gate(1)
    await gate.acquire()
    first = asyncio.create_task(gate.acquire())
    second = asyncio.create_task(gate.acquire())
    await until(lambda: gate.waiting == 2)
    # granted to `first` by the release, then cancelled before it ran: `second` gets it
    gate.release()
    first.cancel()
    with pytest.raises(asyncio.CancelledError):
        await first
    await asyncio.wait_for(second, 5)
    assert gate.in_use == 1 and gate.waiting == 0
    # cancelled while still queued: removed from the queue, the token stays where it is
    third = asyncio.create_task(gate.acquire())
    await until(lambda: gate.waiting == 1)
    third.cancel()
    with pytest.raises(asyncio.CancelledError):
        await third
    assert gate.waiting == 0 and gate.in_use == 1
    gate.release()
    assert gate.in_use == 0


def test_threads_never_hold_more_than_capacity() -> None:
    gate = Gate(3)
    holders = 0
    peak = 0
    lock = threading.Lock()
    taken = 0

    def worker() -> None:
        nonlocal holders, peak, taken
        for _ in range(2000):
            if gate.try_acquire():
                with lock:
                    holders += 1
                    peak = max(peak, holders)
                    taken += 1
                with lock:
                    holders -= 1
                gate.release()

    threads = [threading.Thread(target=worker) for _ in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert 1 <= peak <= 3 and taken > 0 and gate.in_use == 0


def test_misuse_is_refused() -> None:
    with pytest.raises(ValueError, match="capacity"):
        Gate(0)
    gate = Gate(1)
    with pytest.raises(RuntimeError, match="released more often"):
        gate.release()
