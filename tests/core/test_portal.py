"""The shared background loop that sync entry points use."""

from __future__ import annotations

import asyncio
import signal
import threading

import pytest

from toolservices._portal import run_inline, run_sync


async def _add(a: int, b: int) -> int:
    return a + b


def test_run_sync_returns_and_raises() -> None:
    assert run_sync(_add, 2, 3) == 5

    async def fail() -> None:
        raise ValueError("inside")

    with pytest.raises(ValueError, match="inside"):
        run_sync(fail)


def test_run_sync_refuses_to_deadlock_on_its_own_loop() -> None:
    async def nested() -> int:
        return run_sync(_add, 1, 1)

    with pytest.raises(RuntimeError, match="use the async variant"):
        run_sync(nested)


@pytest.mark.skipif(
    threading.current_thread() is not threading.main_thread(), reason="needs the main thread"
)
@pytest.mark.usefixtures("sigint_raises_keyboard_interrupt")
@pytest.mark.parametrize("round_", range(5))
def test_an_interrupted_sync_call_cancels_its_coroutine(round_: int) -> None:
    """Ctrl-C while a sync caller waits must not leave the coroutine running on the loop,
    whether it arrives during the wait or while the call is still being scheduled (which
    a loaded machine hits in about one case out of five)."""
    started = threading.Event()
    cancelled = threading.Event()

    async def wait_forever() -> None:
        started.set()
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            cancelled.set()
            raise

    main = threading.get_ident()

    def interrupt() -> None:
        if started.wait(10):
            signal.pthread_kill(main, signal.SIGINT)

    sender = threading.Thread(target=interrupt)
    sender.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            run_sync(wait_forever)
    finally:
        sender.join(10)
    assert cancelled.wait(10), "the interrupted call's coroutine is still running"


def test_run_inline_runs_a_coroutine_that_never_waits_in_this_thread() -> None:
    caller = threading.current_thread()

    async def where() -> threading.Thread:
        await _add(1, 2)  # awaits that complete at once do not suspend
        return threading.current_thread()

    assert run_inline(where()) is caller

    async def fail() -> None:
        raise ValueError("inside")

    with pytest.raises(ValueError, match="inside"):
        run_inline(fail())


def test_run_inline_refuses_a_coroutine_that_waits_and_closes_it() -> None:
    cleaned: list[bool] = []

    async def waits() -> None:
        try:
            await asyncio.sleep(0)  # yields to a loop there is none of
        finally:
            cleaned.append(True)

    with pytest.raises(RuntimeError, match="waited for the event loop"):
        run_inline(waits())
    assert cleaned == [True]
