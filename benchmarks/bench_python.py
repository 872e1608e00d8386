"""Python execution: toolservices vs TorchRL 0.14.1, side by side in one process.

Run: .venv/bin/python benchmarks/bench_python.py [--quick]

Measures warm ``print(1)`` round trips, a 100-line print, fresh-process
execution, session start, ``fork_session`` and pool throughput on CPU-bound
snippets (pool of 1 vs 2). Prints medians (p50) and ratios.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import logging
import os
import sys
import time
import uuid
from collections.abc import Callable
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _util import fmt_time, measure, median, percentile  # noqa: E402

from toolservices import _portal  # noqa: E402
from toolservices.python import PythonExecutorService, isolation_report  # noqa: E402

PRINT_100 = "for i in range(100):\n    print(i)"
ROUNDS = 5  # interleaved rounds of the warm round-trip variants
POOL_ROUNDS = 4  # interleaved pool-1 / pool-2 throughput runs
CPU = "s = 0\nfor i in range(1_500_000):\n    s += i * i\nprint(s)"


def row(name: str, ours: float, theirs: float | None, target: str = "") -> None:
    ratio = f"{theirs / ours:8.1f}x" if theirs else "       -"
    other = fmt_time(theirs) if theirs else "-"
    print(f"| {name:<44} | {fmt_time(ours):>10} | {other:>10} | {ratio} | {target}")


def torchrl_classes() -> tuple[Any, Any] | None:
    try:
        from torchrl.envs.llm.transforms.tools import (
            PersistentPythonProcess,
        )
        from torchrl.envs.llm.transforms.tools import (
            PythonExecutorService as TorchRLService,
        )
    except ImportError:
        return None
    return PersistentPythonProcess, TorchRLService


def core_round_trip(svc: PythonExecutorService, sid: str, n: int) -> list[float]:
    """Round trips measured on the service's own loop (no thread hop)."""

    async def run() -> list[float]:
        samples = []
        for _ in range(n):
            started = time.perf_counter()
            await svc._execute("print(1)", sid, None)
            samples.append(time.perf_counter() - started)
        return samples

    return _portal.run_sync(run)


def socket_floor(n: int) -> list[float]:
    """Round trip of a 16-byte message to a forked echo process: the machine's floor."""
    import socket

    ours, theirs = socket.socketpair()
    pid = os.fork()
    if pid == 0:
        ours.close()
        while data := theirs.recv(64):
            theirs.send(data)
        os._exit(0)
    theirs.close()
    samples = []
    for _ in range(n):
        started = time.perf_counter()
        ours.send(b"x" * 16)
        ours.recv(64)
        samples.append(time.perf_counter() - started)
    ours.close()
    os.waitpid(pid, 0)
    return samples


def fork_floor(n: int) -> list[float]:
    """fork + _exit + waitpid of this process (it imported torch via TorchRL): why the
    executor never forks the caller."""
    samples = []
    for _ in range(n):
        started = time.perf_counter()
        pid = os.fork()
        if pid == 0:
            os._exit(0)
        os.waitpid(pid, 0)
        samples.append(time.perf_counter() - started)
    return samples


def throughput(execute: Callable[[str, str], Any], jobs: int, workers: int) -> float:
    """Seconds to run ``jobs`` CPU-bound snippets from ``workers`` threads."""
    started = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(workers) as pool:
        results = list(pool.map(lambda k: execute(CPU, f"cpu-{k}"), range(jobs)))
    elapsed = time.perf_counter() - started
    assert all(r["success"] for r in results), results
    return elapsed


def pool_times(
    one: Callable[[str, str], Any], two: Callable[[str, str], Any], jobs: int
) -> tuple[float, float]:
    """Median seconds of pool 1 and pool 2, interleaved (a drifting host hits both)."""
    t1, t2 = [], []
    for _ in range(POOL_ROUNDS):
        t1.append(throughput(one, jobs, 4))
        t2.append(throughput(two, jobs, 4))
    return median(t1), median(t2)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="fewer repetitions")
    args = parser.parse_args()
    reps = 50 if args.quick else 300
    report = isolation_report()
    print(f"isolation level of the sessions: {report.get('level')}")
    print(f"cpus: {os.cpu_count()}, load average: {os.getloadavg()}")
    print()
    print(f"| {'measure (p50)':<44} | {'ours':>10} | {'TorchRL':>10} |  speedup | target")
    print(f"|{'-' * 46}|{'-' * 12}|{'-' * 12}|{'-' * 10}|-------")

    torchrl = torchrl_classes()
    logging.getLogger("torchrl").setLevel(logging.WARNING)  # it logs every line at INFO
    svc = PythonExecutorService(pool_size=2, timeout=30)
    theirs_proc = torchrl[0]() if torchrl else None
    try:
        svc.execute("pass", session_id="warm")

        # warm print(1) round trip: the variants interleaved in rounds, so that a drift
        # of the machine (a neighbour on the host) does not favour one of them
        no_poll = PythonExecutorService(pool_size=2, timeout=30, busy_poll=0)
        no_poll.execute("pass", session_id="warm")
        variants: dict[str, Callable[[int], list[float]]] = {
            "sync": lambda n: measure(
                lambda: svc.execute("print(1)", session_id="warm"), repeats=n
            ),
            "loop": lambda n: core_round_trip(svc, "warm", n),
            "no_poll": lambda n: measure(
                lambda: no_poll.execute("print(1)", session_id="warm"), repeats=n
            ),
            "no_poll_loop": lambda n: core_round_trip(no_poll, "warm", n),
        }
        samples: dict[str, list[float]] = {name: [] for name in variants}
        round_medians: dict[str, list[float]] = {name: [] for name in variants}
        for _ in range(ROUNDS):
            for name, fn in variants.items():
                batch = fn(max(10, reps // ROUNDS))
                samples[name] += batch
                round_medians[name].append(median(batch))
        no_poll.close()
        theirs_rt = (
            measure(lambda: theirs_proc.execute("print(1)"), repeats=max(10, reps // 10))
            if theirs_proc
            else None
        )
        row(
            "warm print(1), sync execute()",
            median(samples["sync"]),
            median(theirs_rt) if theirs_rt else None,
            "< 0.15 ms",
        )
        row("warm print(1), on the service loop", median(samples["loop"]), None, "< 0.15 ms")
        row("warm print(1), sync, busy_poll=0", median(samples["no_poll"]), None)
        row("warm print(1), loop, busy_poll=0", median(samples["no_poll_loop"]), None)
        row("(floor: socketpair echo to a process)", median(socket_floor(reps * 4)), None)
        for name in ("sync", "loop"):
            spread = ", ".join(fmt_time(m) for m in round_medians[name])
            print(f"|   ({name}: p90 {fmt_time(percentile(samples[name], 90))}; rounds {spread})")

        # 100-line print
        ours_100 = measure(lambda: svc.execute(PRINT_100, session_id="warm"), repeats=reps // 2)
        theirs_100 = (
            measure(lambda: theirs_proc.execute(PRINT_100), repeats=3, warmup=1)
            if theirs_proc
            else None
        )
        row(
            "100-line print", median(ours_100), median(theirs_100) if theirs_100 else None, "< 1 ms"
        )

        # fresh-process execution (no session): with a pre-forked spare ready, and back to back
        def spares_ready() -> None:
            while svc.stats()["spares"] < svc.spares:  # refills run in the background
                time.sleep(0.002)

        def timed(fn: Callable[[], Any], n: int) -> list[float]:
            samples = []
            for _ in range(n):
                spares_ready()
                started = time.perf_counter()
                fn()
                samples.append(time.perf_counter() - started)
            return samples

        ours_fresh = timed(lambda: svc.execute("print(1)"), reps // 3)
        ours_fresh_b2b = measure(lambda: svc.execute("print(1)"), repeats=reps // 3)
        theirs_fresh = None
        if torchrl:
            from torchrl.envs.llm.transforms.tools import PythonInterpreter

            interp = PythonInterpreter(persistent=False)
            theirs_fresh = measure(
                lambda: interp._execute_python_code("print(1)", 0), repeats=10, warmup=1
            )
        row(
            "fresh-process print(1), spare ready",
            median(ours_fresh),
            median(theirs_fresh) if theirs_fresh else None,
            "< 5 ms",
        )
        row(
            "fresh-process print(1), back to back",
            median(ours_fresh_b2b),
            median(theirs_fresh) if theirs_fresh else None,
            "< 5 ms",
        )

        row("(fork + exit + wait of this process: torch)", median(fork_floor(30)), None)

        # session start: first call in a new session
        def new_session() -> None:
            sid = uuid.uuid4().hex
            svc.execute("print(1)", session_id=sid)
            svc.close_session(sid)

        ours_start = timed(new_session, reps // 5)
        ours_start_b2b = measure(new_session, repeats=reps // 5)

        def torchrl_start() -> None:
            assert torchrl is not None
            proc = torchrl[0]()
            proc.execute("print(1)")
            proc.cleanup()

        theirs_start = measure(torchrl_start, repeats=5, warmup=1) if torchrl else None
        row(
            "new session: print(1) + close, spare ready",
            median(ours_start),
            median(theirs_start) if theirs_start else None,
        )
        row(
            "new session: print(1) + close, back to back",
            median(ours_start_b2b),
            median(theirs_start) if theirs_start else None,
        )

        # fork_session
        svc.execute("import json\ndata = list(range(100_000))", session_id="src")

        def fork_timed(n: int) -> float:
            started = time.perf_counter()
            copies = svc.fork_session("src", n)
            elapsed = time.perf_counter() - started
            for copy in copies:
                svc.close_session(copy)
            return elapsed

        row("fork_session(src, 1)", median([fork_timed(1) for _ in range(reps // 5)]), None)
        eight = median([fork_timed(8) for _ in range(max(3, reps // 30))])
        row("fork_session(src, 8), per copy", eight / 8, None)
    finally:
        svc.close()
        if theirs_proc:
            theirs_proc.cleanup()

    # fresh process that uses numpy: preloaded in the fork server vs imported per process
    numpy_code = "import numpy as np\nprint(np.arange(10).sum())"
    with PythonExecutorService(pool_size=1, preload=("numpy",)) as with_numpy:
        with_numpy.execute("pass")
        ours_np = []
        for _ in range(max(5, reps // 10)):
            while with_numpy.stats()["spares"] < with_numpy.spares:
                time.sleep(0.002)
            started = time.perf_counter()
            assert with_numpy.execute(numpy_code).stdout == "45\n"
            ours_np.append(time.perf_counter() - started)
    theirs_np = None
    if torchrl:
        from torchrl.envs.llm.transforms.tools import PythonInterpreter

        interp = PythonInterpreter(persistent=False)
        theirs_np = measure(lambda: interp._execute_python_code(numpy_code, 0), repeats=5, warmup=1)
    print()
    row(
        "fresh process using numpy (preload=numpy)",
        median(ours_np),
        median(theirs_np) if theirs_np else None,
    )

    # pool throughput, CPU-bound: pool of 1 vs pool of 2
    jobs = 8
    print()
    with (
        PythonExecutorService(pool_size=1, timeout=60) as one,
        PythonExecutorService(pool_size=2, timeout=60) as two,
    ):
        for svc_ in (one, two):
            svc_.execute("pass")

        def ours_exec(svc_: PythonExecutorService) -> Callable[[str, str], Any]:
            return lambda code, sid: svc_.execute(code, session_id=sid)

        throughput(ours_exec(one), jobs, 4)  # untimed: the sessions exist afterwards
        throughput(ours_exec(two), jobs, 4)
        t1, t2 = pool_times(ours_exec(one), ours_exec(two), jobs)
    print(
        f"pool throughput, {jobs} CPU-bound snippets: pool 1 {fmt_time(t1)}, pool 2 {fmt_time(t2)}"
        f" -> {t1 / t2:.2f}x (target >= 1.8x)"
    )
    if torchrl:
        svc1, svc2 = torchrl[1](pool_size=1), torchrl[1](pool_size=2)
        try:
            for s in (svc1, svc2):
                s.execute("pass")

            def theirs_exec(s: Any) -> Callable[[str, str], Any]:
                return lambda code, sid: s.execute(code)

            r1, r2 = pool_times(theirs_exec(svc1), theirs_exec(svc2), jobs)
            print(
                f"TorchRL PythonExecutorService: pool 1 {fmt_time(r1)}, pool 2 {fmt_time(r2)}"
                f" -> {r1 / r2:.2f}x"
            )
        finally:
            svc1.cleanup()
            svc2.cleanup()


if __name__ == "__main__":
    main()
