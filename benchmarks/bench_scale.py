"""Sessions at scale: 64 -> 4,096 live sessions, locally, on a 3-node Ray cluster, and TorchRL.

Run: .venv/bin/python benchmarks/bench_scale.py [--max 4096] [--ray] [--torchrl] [--png PATH]

Three backends, each level with a new executor:

* ``local``: ``PythonExecutorService(pool_size=8, max_sessions=level)`` in this
  process, its calls on the executor's own event loop (``_portal.run_sync``),
  so no thread hop is measured;
* ``ray`` (``--ray``, levels up to ``--ray-max``, 1,024 by default): a
  simulated cluster of Ray's own ``ray.cluster_utils.Cluster`` (a head
  without CPUs for the driver and three worker nodes of one CPU each, all on
  this machine), the executor registered with ``num_replicas=3`` (one replica
  per worker node through an ``executor`` resource, ``pool_size`` 3 each) and
  called through ``RayServiceClient.acall`` from the driver's event loop;
* ``torchrl`` (``--torchrl``, levels up to ``--torchrl-max``, 256 by
  default): TorchRL 0.14.1's persistent interpreters, one
  ``PersistentPythonProcess`` per session (what its ``PythonInterpreter(
  persistent=True)`` keeps per batch item; its ``PythonExecutorService`` has
  no sessions), called from 8 threads at once.

Each executor is warmed by one call (not counted), then:

* creation: the first call (``x = i``) of every session at once; wall time /
  sessions = amortised ms per session, also per quarter of the sessions in the
  order they came up (flat when creation is linear);
* memory: the PSS (psutil ``memory_full_info().pss``) summed over every
  descendant process of the benchmark after creation, minus the same sum
  before any session existed, divided by the number of sessions;
* warm calls: two rounds over every session at once (``x += 1``, then
  ``print(x)``, whose output is checked: every session kept its state);
  calls/s = calls / wall time, p50/p99 = per-call latency including the wait
  for a slot.

Writes a plot of latency and memory against sessions (``--png``).
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import itertools
import logging
import math
import os
import sys
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from typing import Any

import psutil
from rich.progress import Progress

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _util import median, percentile  # noqa: E402

from toolservices import _portal  # noqa: E402
from toolservices.python import PythonExecutorService  # noqa: E402

LEVELS = (64, 256, 1024, 4096)
MIB = 1024 * 1024
RAY_WORKERS = 3

#: one call: (code, session) -> (seconds, stdout or None when the call failed)
Call = Callable[[str, str], Awaitable[tuple[float, str | None]]]


def descendants_pss() -> float:
    """Bytes of PSS of every process below this one (gone processes are skipped)."""
    total = 0
    for proc in psutil.Process().children(recursive=True):
        try:
            total += proc.memory_full_info().pss
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return total


async def measure_level(backend: str, level: int, call: Call, progress: Progress) -> dict[str, Any]:
    """Create ``level`` sessions at once, then two warm rounds; the figures of one row."""
    await call("pass", "warm-up")  # start the executor (not counted)
    await asyncio.sleep(0.5)  # let its spares finish forking before the baseline
    base = descendants_pss()
    sessions = [f"s{i}" for i in range(level)]
    task = progress.add_task(f"{backend:>7} {level:>5} sessions: create", total=level)
    done_at: list[float] = []

    async def create(i: int, session: str) -> tuple[float, str | None]:
        out = await call(f"x = {i}", session)
        done_at.append(time.perf_counter())
        progress.advance(task)
        return out

    started = time.perf_counter()
    created = await asyncio.gather(*(create(i, s) for i, s in enumerate(sessions)))
    create_wall = time.perf_counter() - started
    edges = [started] + [done_at[level * q // 4 - 1] for q in (1, 2, 3, 4)]
    quarters = [(b - a) / (level / 4) * 1e3 for a, b in itertools.pairwise(edges)]
    assert all(out is not None for _, out in created), "a session failed to start"
    pss = descendants_pss() - base
    warm = progress.add_task(f"{backend:>7} {level:>5} sessions: warm calls", total=2 * level)

    async def again(code: str, session: str) -> tuple[float, str | None]:
        out = await call(code, session)
        progress.advance(warm)
        return out

    started = time.perf_counter()
    first = await asyncio.gather(*(again("x += 1", s) for s in sessions))
    second = await asyncio.gather(*(again("print(x)", s) for s in sessions))
    warm_wall = time.perf_counter() - started
    kept = sum(out == f"{i + 1}\n" for i, (_, out) in enumerate(second))
    assert backend == "torchrl" or kept == level, f"{level - kept} sessions lost their state"
    latencies = [seconds for seconds, _ in (*first, *second)]
    return {
        "backend": backend,
        "sessions": level,
        "create_s": create_wall,
        "create_ms_each": create_wall / level * 1e3,
        "pss_mib_each": pss / level / MIB,
        "calls_per_s": 2 * level / warm_wall,
        "p50_ms": median(latencies) * 1e3,
        "p99_ms": percentile(latencies, 99) * 1e3,
        "quarters": quarters,
        "kept": kept,
    }


# -- the backends ------------------------------------------------------------------------------


def run_local(level: int, pool: int, sandbox: dict[str, Any], progress: Progress) -> dict[str, Any]:
    async def level_run() -> dict[str, Any]:
        config = None
        if sandbox:
            import dataclasses

            from toolservices.python.sandbox import default_config

            config = dataclasses.replace(default_config(), **sandbox)
        executor = PythonExecutorService(
            pool_size=pool, max_sessions=level, timeout=120, sandbox=config
        )

        async def call(code: str, session: str) -> tuple[float, str | None]:
            started = time.perf_counter()
            result = await executor.aexecute(code, session_id=session)
            return time.perf_counter() - started, result.stdout if result.success else None

        try:
            return await measure_level("local", level, call, progress)
        finally:
            await executor.aclose()

    return _portal.run_sync(level_run)


@contextmanager
def ray_cluster() -> Iterator[Any]:
    """A head (the driver's, no CPUs) and three one-CPU worker nodes with an executor slot."""
    import ray
    from ray.cluster_utils import Cluster

    cluster = Cluster(
        initialize_head=True,
        head_node_args={"num_cpus": 0, "include_dashboard": False},
    )
    try:
        for _ in range(RAY_WORKERS):
            cluster.add_node(num_cpus=1, resources={"executor": 1})
        cluster.wait_for_nodes()
        ray.init(address=cluster.address, log_to_driver=False)
        yield cluster
    finally:
        ray.shutdown()
        cluster.shutdown()


def run_ray(level: int, pool: int, progress: Progress) -> dict[str, Any]:
    from toolservices.services import get_services

    registry = get_services("ray", namespace=f"bench-scale-{level}")
    registry.register(
        "python",
        PythonExecutorService,
        pool_size=math.ceil(pool / RAY_WORKERS),
        max_sessions=level,
        timeout=120,
        num_cpus=0,
        resources={"executor": 1},
        num_replicas=RAY_WORKERS,
    )
    client = registry.client("python", timeout=600)

    async def call(code: str, session: str) -> tuple[float, str | None]:
        started = time.perf_counter()
        result = await client.acall("execute", code, session_id=session)
        return time.perf_counter() - started, result.stdout if result.success else None

    try:
        return asyncio.run(measure_level("ray", level, call, progress))
    finally:
        registry.shutdown()


def run_torchrl(level: int, pool: int, progress: Progress) -> dict[str, Any] | None:
    try:
        from torchrl.envs.llm.transforms.tools import PersistentPythonProcess
    except ImportError:
        return None
    logging.getLogger("torchrl").setLevel(logging.WARNING)  # it logs every line at INFO
    procs: dict[str, Any] = {}
    threads = concurrent.futures.ThreadPoolExecutor(pool)

    def execute(code: str, session: str) -> tuple[float, str | None]:
        started = time.perf_counter()
        proc = procs.get(session)
        if proc is None:  # a new session: its own interpreter, started by its first call
            proc = procs[session] = PersistentPythonProcess(timeout=120)
        out = proc.execute(code)
        return time.perf_counter() - started, out["stdout"] if out["success"] else None

    async def call(code: str, session: str) -> tuple[float, str | None]:
        return await asyncio.get_running_loop().run_in_executor(threads, execute, code, session)

    try:
        return asyncio.run(measure_level("torchrl", level, call, progress))
    finally:
        for proc in procs.values():
            threads.submit(proc.cleanup)
        threads.shutdown(wait=True)


# -- output ------------------------------------------------------------------------------------


def plot(rows: list[dict[str, Any]], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    colours = {"local": "C0", "ray": "C1", "torchrl": "C2"}
    labels = {"local": "local", "ray": "Ray, 3 nodes", "torchrl": "TorchRL 0.14.1"}
    ticks: set[int] = set()
    for backend in ("local", "ray", "torchrl"):
        mine = [r for r in rows if r["backend"] == backend]
        if not mine:
            continue
        xs = [r["sessions"] for r in mine]
        ticks.update(xs)
        colour, label = colours[backend], labels[backend]
        left.plot(xs, [r["p50_ms"] for r in mine], "o-", color=colour, label=f"p50, {label}")
        left.plot(xs, [r["p99_ms"] for r in mine], "s--", color=colour, label=f"p99, {label}")
        right.plot(
            xs, [r["pss_mib_each"] for r in mine], "o-", color=colour, label=f"PSS MiB, {label}"
        )
        right.plot(
            xs,
            [r["create_ms_each"] for r in mine],
            "s--",
            color=colour,
            label=f"create ms, {label}",
        )
    left.set(xscale="log", yscale="log", xlabel="concurrent sessions", ylabel="warm call, ms")
    left.set_title("Warm-call latency (all sessions at once)")
    right.axhline(2.5, color="grey", linestyle=":", label="target 2.5 MiB")
    right.set(xscale="log", yscale="log", xlabel="concurrent sessions")
    right.set_title("Memory (PSS) and creation cost per session")
    for axis in (left, right):
        axis.set_xticks(sorted(ticks), [str(s) for s in sorted(ticks)])
        axis.grid(alpha=0.3)
        axis.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def report(rows: list[dict[str, Any]]) -> None:
    print(
        "| backend | sessions | create (total) | create/session | PSS/session | warm calls/s "
        "| p50 | p99 |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(
            f"| {r['backend']} | {r['sessions']:,} | {r['create_s']:.2f} s "
            f"| {r['create_ms_each']:.2f} ms | {r['pss_mib_each']:.2f} MiB "
            f"| {r['calls_per_s']:,.0f} | {r['p50_ms']:.1f} ms | {r['p99_ms']:.1f} ms |"
        )
    for r in rows:
        steps = " / ".join(f"{q:.2f}" for q in r["quarters"])
        lost = (
            f"; state kept by {r['kept']} of {r['sessions']}" if r["kept"] != r["sessions"] else ""
        )
        print(
            f"{r['backend']} {r['sessions']:,} sessions: creation ms/session by quarter: "
            f"{steps}{lost}"
        )
    local = {r["sessions"]: r for r in rows if r["backend"] == "local"}
    if 1024 in local and 4096 in local:
        ratio = local[4096]["create_ms_each"] / local[1024]["create_ms_each"]
        print(f"local creation per session, 4,096 vs 1,024: {ratio:.2f}x (target <= 1.25x)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max", type=int, default=1024, help="largest local level (up to 4096)")
    parser.add_argument("--levels", type=int, nargs="*", help="exactly these local levels")
    parser.add_argument("--pool", type=int, default=8, help="calls at once (pool_size)")
    parser.add_argument("--ray", action="store_true", help="also on a simulated 3-node cluster")
    parser.add_argument("--ray-max", type=int, default=1024)
    parser.add_argument("--torchrl", action="store_true", help="also TorchRL 0.14.1's interpreters")
    parser.add_argument("--torchrl-max", type=int, default=256)
    parser.add_argument(
        "--sandbox",
        nargs="*",
        default=[],
        metavar="FIELD=0|1",
        help="local only: SandboxConfig switches (e.g. memory_cgroup=0) to bisect a cost",
    )
    parser.add_argument("--png", default="docs/scale.png", help="where to draw the plot")
    parser.add_argument("--no-plot", action="store_true")
    args = parser.parse_args()
    levels = args.levels or [n for n in LEVELS if n <= args.max]
    sandbox = {k: v == "1" for k, v in (item.split("=", 1) for item in args.sandbox)}
    load_before = os.getloadavg()
    rows: list[dict[str, Any]] = []
    with Progress() as progress:
        for level in levels:
            rows.append(run_local(level, args.pool, sandbox, progress))
        if args.torchrl:
            for level in (n for n in LEVELS if n <= args.torchrl_max):
                row = run_torchrl(level, args.pool, progress)
                if row is None:
                    print("torchrl is not installed: its rows are skipped")
                    break
                rows.append(row)
        if args.ray:
            with ray_cluster():
                for level in (n for n in LEVELS if n <= args.ray_max):
                    rows.append(run_ray(level, args.pool, progress))
    load_after = os.getloadavg()
    before, after = (" / ".join(f"{x:.2f}" for x in load) for load in (load_before, load_after))
    print(f"\n{os.cpu_count()} CPUs; load average (1/5/15 min) before {before}, after {after}")
    if sandbox:
        print(f"sandbox switches (local): {sandbox}")
    report(rows)
    if not args.no_plot:
        plot(rows, args.png)
        print(f"plot: {args.png}")


if __name__ == "__main__":
    main()
