"""SIGINT/SIGTERM drain the server: calls that finish within the grace keep their result,
the others are cancelled with a result saying so, and the process exits 0 promptly, quietly
(no traceback) and without leaving interpreters behind.

Regressions: SIGTERM printed a 45-line traceback; SIGINT during a call waited for it and
then lost its result; a stdio server whose client kept stdin open never exited.
"""

from __future__ import annotations

import os
import signal
import sys
import tempfile
from pathlib import Path
from typing import Any, TextIO

import anyio
import psutil
import pytest
from tests.mcp._serve_util import (
    CLI,
    HOSTILE,
    WAIT,
    call,
    descendants,
    http_session,
    kill_group,
    raised_niceness,
    start_server,
    stdio_session,
    wait_until,
)

# Each snippet marks its interpreter with a niceness the test can see (a kernel fact, so a
# rendezvous without sleeps): the call is running when the marker shows up.
QUICK = "import os, time; os.nice(7); time.sleep(1.0); print('quick done')"
STUCK = "import os, time; os.nice(9); time.sleep(600)"
SHUT_DOWN = "The server shut down before this call finished"


def _niceness_seen(server: int, *values: int) -> bool:
    seen = set()
    for pid in descendants(server):
        try:
            seen.add(psutil.Process(pid).nice())
        except psutil.NoSuchProcess:
            continue
    return {raised_niceness(v) for v in values} <= seen


async def _two_calls(session: Any, results: dict[str, Any]) -> None:
    async def run(name: str, code: str) -> None:
        results[name] = await call(session, "python_execute", code=code)

    async with anyio.create_task_group() as tg:
        tg.start_soon(run, "quick", QUICK)
        tg.start_soon(run, "stuck", STUCK)


def _check_drained(results: dict[str, Any]) -> None:
    quick, stuck = results["quick"], results["stuck"]
    assert not quick.is_error and quick.structured_content["stdout"] == "quick done\n"
    assert stuck.is_error and SHUT_DOWN in stuck.content[0].text


def _server_pid(marker: str) -> int:
    found: list[int] = []

    def look() -> bool:
        found[:] = [
            p.pid
            for p in psutil.Process().children(recursive=True)
            if marker in " ".join(p.cmdline()) and p.name() != "sh"
        ]
        return bool(found)

    assert wait_until(look), "the server process did not show up"
    return found[0]


async def _drive_stdio(argv: list[str], errlog: TextIO) -> tuple[dict[str, Any], list[Any]]:
    results: dict[str, Any] = {}
    async with stdio_session(argv, errlog=errlog) as session, anyio.create_task_group() as tg:
        tg.start_soon(_two_calls, session, results)
        server = await anyio.to_thread.run_sync(_server_pid, "serve --mcp --timeout 900")
        assert await anyio.to_thread.run_sync(
            lambda: wait_until(lambda: _niceness_seen(server, 7, 9))
        )
        family = [psutil.Process(p) for p in descendants(server)]
        os.kill(server, signal.SIGINT)
    return results, family


def test_stdio_sigint_drains_and_exits_quietly() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        status, errlog = Path(tmp, "status"), Path(tmp, "stderr")
        # sh records the server's exit status (the SDK's client keeps the process to itself).
        argv = ["sh", "-c", f'"$0" "$@"; echo $? > {status}', CLI, "serve", "--mcp"]
        argv += ["--timeout", "900", "--shutdown-grace", "8", "--pool-size", "2"]
        with errlog.open("w") as err:
            results, family = anyio.run(_drive_stdio, argv, err)
        _check_drained(results)
        assert wait_until(lambda: status.exists() and status.read_text().strip() != "")
        assert status.read_text().strip() == "0"
        assert "Traceback" not in errlog.read_text(), errlog.read_text()
        _gone, alive = psutil.wait_procs(family, timeout=WAIT)
        assert not alive, f"left behind: {alive}"


async def test_http_sigterm_drains_and_exits_quietly() -> None:
    argv = [CLI, "serve", "--mcp", "--transport", "http", "--port", "0"]
    proc, url = start_server([*argv, "--timeout", "900", "--shutdown-grace", "8"])
    try:
        results: dict[str, Any] = {}
        async with http_session(url) as session, anyio.create_task_group() as tg:
            tg.start_soon(_two_calls, session, results)
            assert await anyio.to_thread.run_sync(
                lambda: wait_until(lambda: _niceness_seen(proc.pid, 7, 9))
            )
            family = [psutil.Process(p) for p in descendants(proc.pid)]
            proc.send_signal(signal.SIGTERM)
        _check_drained(results)
        assert proc.wait(WAIT) == 0
        assert proc.stderr is not None
        stderr = proc.stderr.read()
        assert "Traceback" not in stderr and "ERROR" not in stderr, stderr
        _gone, alive = psutil.wait_procs(family, timeout=WAIT)
        assert not alive, f"left behind: {alive}"
    finally:
        kill_group(proc)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_idle_http_server_stops_at_once_with_status_0(sig: signal.Signals) -> None:
    """Any registry served over HTTP, with a client's event stream open."""
    proc, url = start_server([sys.executable, HOSTILE, "http"])
    try:

        async def connected_then_signal() -> None:
            async with http_session(url) as session:
                await call(session, "surrogate_text")
                proc.send_signal(sig)
                await anyio.to_thread.run_sync(proc.wait, WAIT)

        anyio.run(connected_then_signal)
        assert proc.returncode == 0
        assert proc.stderr is not None
        stderr = proc.stderr.read()
        assert "Traceback" not in stderr and "ERROR" not in stderr, stderr
    finally:
        kill_group(proc)


async def test_second_signal_cuts_the_grace_short() -> None:
    """A stuck call and a long grace: the second SIGINT cancels it now."""
    proc, url = start_server([sys.executable, HOSTILE, "http", "--grace", "600"])
    try:
        assert proc.stderr is not None
        async with http_session(url) as session, anyio.create_task_group() as tg:
            results: list[Any] = []

            async def blocked() -> None:
                results.append(await call(session, "block"))

            tg.start_soon(blocked)
            line = await anyio.to_thread.run_sync(proc.stderr.readline)
            assert line.strip() == "BLOCKING"
            proc.send_signal(signal.SIGINT)
            # Signals sent back to back can merge into one: wait until the first is seen
            # (new calls are refused), then send the second.
            with anyio.fail_after(WAIT):
                while not (await call(session, "surrogate_text")).is_error:
                    pass  # each probe is a round trip
            refused = await call(session, "surrogate_text")
            assert refused.content[0].text == "The server is shutting down; the call was not run."
            proc.send_signal(signal.SIGINT)
        [result] = results
        assert result.is_error and SHUT_DOWN in result.content[0].text
        assert proc.wait(WAIT) == 0
        assert "Traceback" not in proc.stderr.read()
    finally:
        kill_group(proc)
