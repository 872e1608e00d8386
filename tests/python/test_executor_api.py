"""The executor's public API at its edges: queue accounting, argument checks, close_session."""

from __future__ import annotations

import gc
import math
from functools import partial

import anyio
import psutil
import pytest
from tests._wait import until

from toolservices.errors import UserError
from toolservices.python import PythonExecutorService

BAD_TIMEOUTS = [float("nan"), float("inf"), -1.0, 0, "5", True, [5]]


def test_cancelled_session_calls_leave_the_queue_count_at_zero(
    service: PythonExecutorService, sid: str
) -> None:
    async def cancel_while_running() -> None:
        for _ in range(3):
            with anyio.move_on_after(0.3):
                await service.aexecute("import time\ntime.sleep(30)", session_id=sid)

    service.execute("pass", session_id=sid)
    anyio.run(cancel_while_running)
    assert service.stats()["queued"] == 0
    assert service.execute("print(1)", session_id=sid).stdout == "1\n"
    assert service.stats()["queued"] == 0
    service.close_session(sid)


def test_max_queue_still_holds_after_cancelled_calls(sid: str) -> None:
    async def settle(svc: PythonExecutorService) -> None:
        # until cancellations have reached the service's loop
        await until(lambda: svc.stats()["busy_sessions"] == 0 == svc.stats()["queued"], step=0.01)

    async def scenario(svc: PythonExecutorService) -> BaseException | None:
        for _ in range(3):  # each cancelled call used to leave the count one lower
            with anyio.move_on_after(0.3):
                await svc.aexecute("import time\ntime.sleep(30)", session_id=sid)
        await settle(svc)
        refused: BaseException | None = None
        async with anyio.create_task_group() as tg:
            # one call takes the only slot (until cancelled), one waits: the queue is full
            tg.start_soon(
                partial(svc.aexecute, "import time\ntime.sleep(60)", session_id=f"{sid}-a")
            )
            await until(
                lambda: svc.stats()["busy_sessions"] >= 1 and svc.stats()["queued"] == 0,
                step=0.01,
            )
            tg.start_soon(partial(svc.aexecute, "pass", session_id=f"{sid}-b"))
            await until(lambda: svc.stats()["queued"] >= 1, step=0.01)  # it is queued
            try:
                await svc.aexecute("pass", session_id=f"{sid}-c")
            except Exception as exc:  # noqa: BLE001 - returned for the assertion
                refused = exc
            tg.cancel_scope.cancel()
        await settle(svc)
        return refused

    with PythonExecutorService(pool_size=1, max_queue=1, timeout=90) as svc:
        refused = anyio.run(scenario, svc)
        assert refused is not None and "queue is full" in str(refused)
        assert svc.stats()["queued"] == 0


@pytest.mark.parametrize("bad", BAD_TIMEOUTS, ids=repr)
def test_bad_timeouts_are_refused_at_construction(bad: object) -> None:
    with pytest.raises(UserError, match="timeout must be a finite number of seconds > 0"):
        PythonExecutorService(timeout=bad)  # type: ignore[arg-type]


@pytest.mark.parametrize("bad", BAD_TIMEOUTS, ids=repr)
def test_bad_timeouts_are_refused_per_call(
    service: PythonExecutorService, sid: str, bad: object
) -> None:
    service.execute("pass", session_id=sid)  # live and idle: the direct route is open
    for session in (sid, None, f"{sid}-new"):
        with pytest.raises(UserError, match="timeout must be a finite number of seconds > 0"):
            service.execute("pass", session_id=session, timeout=bad)  # type: ignore[arg-type]

    async def in_async() -> None:
        with pytest.raises(UserError, match="timeout must be a finite number of seconds > 0"):
            await service.aexecute("pass", session_id=sid, timeout=bad)  # type: ignore[arg-type]

    anyio.run(in_async)
    assert service.stats()["queued"] == 0
    assert service.execute("print(2)", session_id=sid).stdout == "2\n"
    service.close_session(sid)


def test_integral_and_float_timeouts_are_fine(service: PythonExecutorService) -> None:
    assert service.execute("pass", timeout=3).success
    assert service.execute("pass", timeout=0.5 + math.ulp(1.0)).success


@pytest.mark.parametrize("bad", ["", 5, 5.0, b"s", ("a",)], ids=repr)
def test_session_ids_must_be_non_empty_strings(service: PythonExecutorService, bad: object) -> None:
    with pytest.raises(UserError, match="session_id must be a non-empty str"):
        service.execute("x = 1", session_id=bad)  # type: ignore[arg-type]
    with pytest.raises(UserError, match="session_id must be a non-empty str"):
        service.close_session(bad)  # type: ignore[arg-type]
    with pytest.raises(UserError, match="session_id must be a non-empty str"):
        service.fork_session(bad)  # type: ignore[arg-type]


def test_int_and_str_ids_never_share_a_session(service: PythonExecutorService, sid: str) -> None:
    service.execute("x = 'str'", session_id="5" + sid)
    with pytest.raises(UserError):
        service.execute("print(x)", session_id=5)  # type: ignore[arg-type]
    service.close_session("5" + sid)


def test_close_session_says_whether_there_was_one(service: PythonExecutorService, sid: str) -> None:
    assert service.close_session(sid) is False  # never created: "no such session"
    service.execute("pass", session_id=sid)
    assert service.close_session(sid) is True
    assert service.close_session(sid) is False  # closed already

    async def in_async() -> tuple[bool, bool]:
        await service.aexecute("pass", session_id=sid)
        return await service.aclose_session(sid), await service.aclose_session(sid)

    assert anyio.run(in_async) == (True, False)


def test_a_call_cancelled_while_the_fork_server_starts_leaks_nothing(sid: str) -> None:
    """The first call starts the fork server; cancelled meanwhile, the server is stopped."""

    async def cancel_early(svc: PythonExecutorService) -> None:
        with anyio.move_on_after(0.01):
            await svc.aexecute("pass", session_id=sid)

    # fork servers are our direct children (other services' sessions are further down)
    before = {p.pid for p in psutil.Process().children()}
    svc = PythonExecutorService(pool_size=1, timeout=10)
    try:
        anyio.run(cancel_early, svc)
        assert svc.stats()["queued"] == 0
        assert svc.execute("print(3)", session_id=sid).stdout == "3\n"  # starts a new one
    finally:
        svc.close()
    gc.collect()  # an abandoned server's socket, log and Popen warn here (errors in pytest)
    left = [p for p in psutil.Process().children() if p.pid not in before]
    _gone, alive = psutil.wait_procs(left, timeout=10)
    assert not alive
