"""Sessions at scale: 64 -> 256 -> 1,024 (-> 4,096) live sessions in one local executor.

Run: .venv/bin/python benchmarks/bench_scale.py [--max 4096] [--png docs/scale.png]

For each level a new ``PythonExecutorService(pool_size=8, max_sessions=level)``
is started (its fork server warmed by one fresh call, not counted), then:

* creation: ``aexecute("x = i", session_id=...)`` for every session at once;
  wall time / sessions = amortised ms per session;
* memory: the PSS (psutil ``memory_full_info().pss``) summed over every
  descendant process of the benchmark (the fork server, its interpreters and
  spares) after creation, minus the same sum before any session existed,
  divided by the number of sessions;
* warm calls: two rounds over every session at once (``x += 1``, then
  ``print(x)``, whose output is checked: every session kept its state);
  calls/s = calls / wall time, p50/p99 = per-call latency including the wait
  for one of the 8 slots.

The calls run on the executor's own event loop (``_portal.run_sync``), so no
thread hop is measured. Writes a plot of latency and memory against sessions.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import os
import sys
import time
from typing import Any

import psutil
from rich.progress import Progress

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _util import median, percentile  # noqa: E402

from toolservices import _portal  # noqa: E402
from toolservices.python import PythonExecutorService  # noqa: E402

LEVELS = (64, 256, 1024, 4096)
MIB = 1024 * 1024


def descendants_pss() -> float:
    """Bytes of PSS of every process below this one (gone processes are skipped)."""
    total = 0
    for proc in psutil.Process().children(recursive=True):
        try:
            total += proc.memory_full_info().pss
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return total


async def timed(executor: PythonExecutorService, code: str, session: str) -> tuple[float, Any]:
    started = time.perf_counter()
    result = await executor.aexecute(code, session_id=session)
    return time.perf_counter() - started, result


async def run_level(level: int, pool: int, progress: Progress) -> dict[str, Any]:
    executor = PythonExecutorService(pool_size=pool, max_sessions=level, timeout=120)
    try:
        await executor.aexecute("pass")  # start and warm the fork server
        await asyncio.sleep(0.5)  # let its spares finish forking before the baseline
        base = descendants_pss()
        sessions = [f"s{i}" for i in range(level)]
        task = progress.add_task(f"{level:>5} sessions: create", total=level)

        done_at: list[float] = []

        async def create(i: int, session: str) -> tuple[float, Any]:
            out = await timed(executor, f"x = {i}", session)
            done_at.append(time.perf_counter())
            progress.advance(task)
            return out

        started = time.perf_counter()
        created = await asyncio.gather(*(create(i, s) for i, s in enumerate(sessions)))
        create_wall = time.perf_counter() - started
        # ms per session for each quarter of the sessions, in the order they came up:
        # flat when creation is linear, rising when it slows with the sessions already live
        edges = [started] + [done_at[level * q // 4 - 1] for q in (1, 2, 3, 4)]
        quarters = [(b - a) / (level / 4) * 1e3 for a, b in itertools.pairwise(edges)]
        assert all(r.success for _, r in created), "a session failed to start"
        pss = descendants_pss() - base

        warm = progress.add_task(f"{level:>5} sessions: warm calls", total=2 * level)

        async def call(code: str, session: str) -> tuple[float, Any]:
            out = await timed(executor, code, session)
            progress.advance(warm)
            return out

        started = time.perf_counter()
        first = await asyncio.gather(*(call("x += 1", s) for s in sessions))
        second = await asyncio.gather(*(call("print(x)", s) for s in sessions))
        warm_wall = time.perf_counter() - started
        for i, (_, result) in enumerate(second):
            assert result.stdout == f"{i + 1}\n" and not result.restarted, (i, result)
        latencies = [seconds for seconds, _ in (*first, *second)]
        return {
            "sessions": level,
            "create_s": create_wall,
            "create_ms_each": create_wall / level * 1e3,
            "pss_mib_each": pss / level / MIB,
            "pss_mib_total": pss / MIB,
            "calls_per_s": 2 * level / warm_wall,
            "p50_ms": median(latencies) * 1e3,
            "p99_ms": percentile(latencies, 99) * 1e3,
            "quarters": quarters,
        }
    finally:
        await executor.aclose()


def plot(rows: list[dict[str, Any]], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sessions = [r["sessions"] for r in rows]
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    left.plot(sessions, [r["p50_ms"] for r in rows], "o-", label="p50")
    left.plot(sessions, [r["p99_ms"] for r in rows], "s-", label="p99")
    left.set(xscale="log", yscale="log", xlabel="concurrent sessions", ylabel="warm call, ms")
    left.set_title("Warm-call latency (all sessions at once, pool 8)")
    left.legend()
    right.plot(sessions, [r["pss_mib_each"] for r in rows], "o-", label="PSS per session, MiB")
    right.plot(sessions, [r["create_ms_each"] for r in rows], "s-", label="creation, ms/session")
    right.axhline(2.5, color="grey", linestyle=":", label="target 2.5 MiB")
    right.set(xscale="log", xlabel="concurrent sessions")
    right.set_title("Memory and creation cost per session")
    right.legend()
    for axis in (left, right):
        axis.set_xticks(sessions, [str(s) for s in sessions])
        axis.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max", type=int, default=1024, help="largest level (up to 4096)")
    parser.add_argument("--pool", type=int, default=8, help="pool_size of the executor")
    parser.add_argument("--png", default="docs/scale.png", help="where to draw the plot")
    parser.add_argument("--no-plot", action="store_true")
    args = parser.parse_args()
    levels = [n for n in LEVELS if n <= args.max]
    load_before = os.getloadavg()
    rows = []
    with Progress() as progress:
        for level in levels:
            rows.append(_portal.run_sync(run_level, level, args.pool, progress))
    load_after = os.getloadavg()
    before, after = (" / ".join(f"{x:.2f}" for x in load) for load in (load_before, load_after))
    print(f"\n{os.cpu_count()} CPUs; load average (1/5/15 min) before {before}, after {after}")
    print("| sessions | create (total) | create/session | PSS/session | warm calls/s | p50 | p99 |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(
            f"| {r['sessions']:,} | {r['create_s']:.2f} s | {r['create_ms_each']:.2f} ms "
            f"| {r['pss_mib_each']:.2f} MiB | {r['calls_per_s']:,.0f} | {r['p50_ms']:.1f} ms "
            f"| {r['p99_ms']:.1f} ms |"
        )
    for r in rows:
        steps = " / ".join(f"{q:.2f}" for q in r["quarters"])
        print(f"{r['sessions']:,} sessions: creation ms/session by quarter: {steps}")
    if 1024 in levels and 4096 in levels:
        ratio = (
            rows[levels.index(4096)]["create_ms_each"] / rows[levels.index(1024)]["create_ms_each"]
        )
        print(f"creation per session, 4,096 vs 1,024: {ratio:.2f}x (target <= 1.25x)")
    if not args.no_plot:
        plot(rows, args.png)
        print(f"plot: {args.png}")


if __name__ == "__main__":
    main()
