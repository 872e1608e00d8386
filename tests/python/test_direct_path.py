"""Sync ``execute`` on an idle session talks to the interpreter from the calling thread.

The same outcomes are checked through both routes: ``sync`` (the caller's
thread, once the session is live) and ``loop`` (``aexecute``, on the
library's event loop). ``stats()["direct_calls"]`` tells which route a call took.
"""

from __future__ import annotations

import asyncio
import signal
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import pytest
from tests._wait import wait_until

from toolservices import _portal
from toolservices.errors import UserError
from toolservices.python import ExecResult, PythonExecutorService

Run = Callable[..., ExecResult]


@pytest.fixture(params=["sync", "loop"])
def run(request: pytest.FixtureRequest, service: PythonExecutorService) -> Run:
    if request.param == "sync":
        return service.execute

    def via_loop(code: str, **kwargs: object) -> ExecResult:
        return asyncio.run(service.aexecute(code, **kwargs))  # type: ignore[arg-type]

    return via_loop


def _direct(service: PythonExecutorService) -> int:
    return int(service.stats()["direct_calls"])


def test_sync_calls_on_a_live_session_skip_the_loop(
    service: PythonExecutorService, sid: str
) -> None:
    service.execute("total = 0", session_id=sid)  # creates the session: through the loop
    before = _direct(service)
    for k in range(20):
        assert service.execute(f"total += {k}", session_id=sid).success
    assert service.execute("print(total)", session_id=sid).stdout == f"{sum(range(20))}\n"
    assert _direct(service) - before == 21
    asyncio.run(service.aexecute("total = -1", session_id=sid))
    assert _direct(service) - before == 21  # aexecute never takes it
    service.close_session(sid)


@pytest.mark.parametrize(
    ("code", "check"),
    [
        (
            "print('start', flush=True)\nwhile True: pass",
            lambda r: r.timed_out and r.stdout == "start\n" and r.returncode == -1,
        ),
        ("import os\nos._exit(9)", lambda r: r.returncode == 9 and not r.timed_out),
        (
            "import os, stat\nfor fd in range(3, 64):\n    try:\n"
            "        if stat.S_ISSOCK(os.fstat(fd).st_mode):\n"
            "            os.write(fd, b'\\xff' * 64)\n    except OSError:\n        pass",
            lambda r: not r.timed_out,
        ),
    ],
    ids=["timeout", "os-exit", "forged-frames"],
)
def test_a_failed_call_restarts_the_session_on_both_routes(
    service: PythonExecutorService, sid: str, run: Run, code: str, check: Callable[..., bool]
) -> None:
    service.execute("kept = 1", session_id=sid)
    result = run(code, session_id=sid, timeout=0.5)
    assert not result.success and result.restarted and check(result), result
    after = run("print('kept' in globals())", session_id=sid)
    assert after.success and after.stdout == "False\n" and not after.restarted
    service.close_session(sid)


def test_never_two_calls_in_one_interpreter(service: PythonExecutorService, sid: str) -> None:
    """Threads (direct) and loop tasks share one session: calls run one after another."""
    service.execute("inside = 0\ncalls = 0", session_id=sid)
    code = (
        "import time\ninside += 1\nassert inside == 1, 'two calls at once'\n"
        "time.sleep(0.002)\ncalls += 1\ninside -= 1"
    )

    async def from_loop(n: int) -> list[ExecResult]:
        return [await service.aexecute(code, session_id=sid) for _ in range(n)]

    with ThreadPoolExecutor(4) as pool:
        threaded = [pool.submit(service.execute, code, session_id=sid) for _ in range(40)]
        looped = asyncio.run(from_loop(10))
        results = [f.result() for f in threaded] + looped
    assert all(r.success for r in results), [r.stderr for r in results if not r.success]
    assert service.execute("print(calls)", session_id=sid).stdout == "50\n"
    service.close_session(sid)


def test_a_loop_caller_waits_for_a_thread_then_runs(
    service: PythonExecutorService, sid: str
) -> None:
    service.execute("order = []", session_id=sid)
    started = threading.Event()

    def slow() -> ExecResult:
        started.set()
        return service.execute(
            "import time\ntime.sleep(0.3)\norder.append('thread')", session_id=sid
        )

    async def after_it() -> ExecResult:
        return await service.aexecute("order.append('loop')\nprint(order)", session_id=sid)

    with ThreadPoolExecutor(1) as pool:
        first = pool.submit(slow)
        started.wait()
        while not service.stats()["busy_sessions"]:  # the thread holds the session
            threading.Event().wait(0.001)
        second = asyncio.run(after_it())
        assert first.result().success
    assert second.stdout == "['thread', 'loop']\n"
    service.close_session(sid)


def test_close_and_eviction_never_cut_a_direct_call() -> None:
    """Sessions evicted and closed while threads call them: every call completes.

    Three threads keep at most three sessions busy, so one of the four is
    always idle and can be evicted (when all are busy the call is refused).
    """
    with PythonExecutorService(pool_size=2, max_sessions=4, timeout=5) as svc:
        ids = [f"s{k}" for k in range(7)]
        for sid in ids:
            svc.execute(f"me = {sid!r}", session_id=sid)

        def work(k: int) -> ExecResult:
            sid = ids[k // 6 % len(ids)]  # runs of calls on one session, then the next
            if k % 11 == 0:
                svc.close_session(sid)
            return svc.execute(f"me = globals().get('me', {sid!r})\nprint(me)", session_id=sid)

        with ThreadPoolExecutor(3) as pool:
            results = list(pool.map(work, range(120)))
        for k, result in enumerate(results):
            assert result.success and result.stdout == f"{ids[k // 6 % len(ids)]}\n", result
        stats = svc.stats()
        assert stats["sessions"] <= 4 and stats["evictions"] > 0 and stats["direct_calls"] > 0
        assert stats["busy_sessions"] == 0 and stats["queued"] == 0


def test_busy_poll_is_configurable_and_checked() -> None:
    with PythonExecutorService(pool_size=1, busy_poll=0) as svc:
        svc.execute("x = 1", session_id="a")
        assert svc.execute("print(x)", session_id="a").stdout == "1\n"
        assert svc.stats()["direct_calls"] == 1
    with pytest.raises(UserError, match="busy_poll"):
        PythonExecutorService(busy_poll=1.0)


def test_sync_execute_from_the_loop_thread_is_refused(service: PythonExecutorService) -> None:
    service.execute("pass", session_id="loop-thread")

    async def inside() -> None:
        service.execute("pass", session_id="loop-thread")

    with pytest.raises(RuntimeError, match="inside its own event loop"):
        _portal.run_sync(inside)
    service.close_session("loop-thread")


@pytest.mark.usefixtures("sigint_raises_keyboard_interrupt")
def test_an_interrupted_call_makes_the_next_one_say_the_state_is_lost(
    service: PythonExecutorService, sid: str
) -> None:
    """Ctrl-C in the caller (direct route) or a cancelled task (loop route)."""
    service.execute("kept = 1", session_id=sid)
    main = threading.main_thread().ident
    assert main is not None and threading.current_thread() is threading.main_thread()
    timer = threading.Timer(0.3, signal.pthread_kill, (main, signal.SIGINT))
    timer.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            service.execute("import time\ntime.sleep(5)", session_id=sid)
    finally:
        timer.cancel()
    after = service.execute("print('kept' in globals())", session_id=sid)
    assert after.restarted and after.stdout == "False\n"

    service.execute("kept = 2", session_id=sid)

    async def cancel_mid_call() -> None:
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(
                service.aexecute("import time\ntime.sleep(5)", session_id=sid), 0.3
            )

    asyncio.run(cancel_mid_call())
    again = service.execute("print('kept' in globals())", session_id=sid)
    assert again.restarted and again.stdout == "False\n"
    assert not service.execute("print(1)", session_id=sid).restarted
    service.close_session(sid)


def test_a_new_session_takes_a_ready_spare_without_the_loop() -> None:
    with PythonExecutorService(pool_size=2, timeout=10.0, max_sessions=8, spares=1) as svc:
        svc.execute("pass")  # starts the fork server; its spare follows
        wait_until(lambda: svc.stats()["spares"] >= 1)
        before = _direct(svc)
        assert svc.execute("x = 41", session_id="fresh").success
        assert _direct(svc) - before == 1  # the spare, taken in this thread
        assert svc.execute("print(x + 1)", session_id="fresh").stdout == "42\n"
        wait_until(lambda: svc.stats()["spares"] >= 1)  # ordered again after the call
        # with no spare ready, the loop makes the session (and spawns its interpreter)
        svc.spares = 0  # none made again: the one ready goes to the next new session
        assert svc.execute("pass", session_id="takes-it").success
        assert svc.stats()["spares"] == 0
        before = _direct(svc)
        assert svc.execute("y = 1", session_id="later").success
        assert _direct(svc) == before


def test_threads_starting_one_new_session_share_it() -> None:
    # the caller's threads and the loop may make the same new session at once: one wins
    with PythonExecutorService(pool_size=4, timeout=10.0, max_sessions=8, spares=2) as svc:
        svc.execute("pass")
        wait_until(lambda: svc.stats()["spares"] >= 2)
        start = threading.Barrier(4)

        def first(k: int) -> ExecResult:
            start.wait()
            if k % 2:
                return asyncio.run(svc.aexecute("n = globals().get('n', 0) + 1", session_id="one"))
            return svc.execute("n = globals().get('n', 0) + 1", session_id="one")

        with ThreadPoolExecutor(4) as pool:
            assert all(r.success for r in pool.map(first, range(4)))
        assert svc.execute("print(n)", session_id="one").stdout == "4\n"
        assert svc.stats()["sessions"] == 1
