"""Service registry overhead: a trivial method on each backend, and the Python executor on Ray.

Run:  .venv/bin/python benchmarks/bench_services.py [--calls 300] [--pool-size 2]

Prints medians (p50) and p90 in milliseconds. The executor section runs our
``PythonExecutorService`` and TorchRL 0.14.1's (registered through
``torchrl.services``) side by side on the same local Ray instance.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from collections.abc import Awaitable, Callable
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _util  # noqa: E402
from _util import median, percentile  # noqa: E402

from toolservices.services import get_services  # noqa: E402

RAY_INIT = {"num_cpus": 2, "include_dashboard": False, "log_to_driver": False}


class Echo:
    """The trivial service: returns its argument."""

    def ping(self, x: int = 0) -> int:
        return x


def _stats(samples: list[float]) -> tuple[float, float]:
    return median(samples) * 1e3, percentile(samples, 90) * 1e3


def measure(fn: Callable[[], Any], calls: int, warmup: int = 20) -> tuple[float, float]:
    return _stats(_util.measure(fn, repeats=calls, warmup=warmup))


def ameasure(fn: Callable[[], Awaitable[Any]], calls: int, warmup: int = 20) -> tuple[float, float]:
    async def run() -> list[float]:
        for _ in range(warmup):
            await fn()
        samples = []
        for _ in range(calls):
            start = time.perf_counter()
            await fn()
            samples.append(time.perf_counter() - start)
        return samples

    return _stats(asyncio.run(run()))


def row(
    label: str, figures: tuple[float, float], ref: float | None = None, *, scale: float = 1.0
) -> str:
    p50, p90 = figures[0] * scale, figures[1] * scale
    ratio = f"{ref / figures[0]:.1f}x" if ref else ""
    return f"| {label} | {p50:.3f} | {p90:.3f} | {ratio} |"


def bench_trivial(calls: int) -> list[str]:
    lines = ["| trivial method `ping(1)` | p50 µs | p90 µs | |", "|---|---|---|---|"]
    us = 1000.0
    direct = Echo()
    lines.append(
        row("plain Python method call (baseline)", measure(lambda: direct.ping(1), calls), scale=us)
    )
    for backend in ("local", "ray"):
        kwargs = {"ray_init_config": RAY_INIT} if backend == "ray" else {}
        registry = get_services(backend, namespace="bench-trivial", **kwargs)
        registry.reset()
        handle = registry.register("echo", Echo)
        client = registry.client("echo")
        if backend == "ray":
            import ray

            lines.append(
                row(
                    "ray: raw `ray.get(handle.ping.remote(1))`",
                    measure(lambda h=handle: ray.get(h.ping.remote(1)), calls),
                    scale=us,
                )
            )
        lines.append(
            row(
                f"{backend}: `client.call('ping', 1)`",
                measure(lambda c=client: c.call("ping", 1), calls),
                scale=us,
            )
        )
        lines.append(
            row(
                f"{backend}: `await client.acall('ping', 1)`",
                ameasure(lambda c=client: c.acall("ping", 1), calls),
                scale=us,
            )
        )
        registry.shutdown()
    return lines


def bench_executor(calls: int, pool_size: int) -> list[str]:
    import ray
    from torchrl.envs.llm.transforms.tools import PythonExecutorService as TorchRLExecutor
    from torchrl.services import get_services as torchrl_get_services

    from toolservices.python import PythonExecutorService

    lines = [
        "| executor on Ray, `print(1)` | p50 ms | p90 ms | TorchRL p50 / this p50 |",
        "|---|---|---|---|",
    ]

    ours = get_services("ray", namespace="bench-executor", ray_init_config=RAY_INIT)
    ours.reset()
    start = time.perf_counter()
    ours.register("python", PythonExecutorService, pool_size=pool_size, timeout=10.0)
    client = ours.client("python")
    assert client.call("execute", "print(1)", session_id="s")["stdout"] == "1\n"
    ours_first = time.perf_counter() - start

    theirs = torchrl_get_services("ray", namespace="bench-executor-torchrl")
    theirs.reset()
    start = time.perf_counter()
    theirs.register(
        "python_executor",
        TorchRLExecutor,
        pool_size=pool_size,
        timeout=10.0,
        max_concurrency=pool_size,
    )
    actor = theirs["python_executor"]
    assert ray.get(actor.execute.remote("print(1)"))["stdout"].strip() == "1"
    theirs_first = time.perf_counter() - start

    torchrl_fig = measure(lambda: ray.get(actor.execute.remote("print(1)")), calls)
    ref = torchrl_fig[0]
    lines.append(
        row("TorchRL 0.14.1 actor: `ray.get(actor.execute.remote(...))`", torchrl_fig, ref)
    )
    lines.append(
        row(
            "ours, sync `client.call('execute', ..., session_id=...)`",
            measure(lambda: client.call("execute", "print(1)", session_id="s"), calls),
            ref,
        )
    )
    lines.append(
        row(
            "ours, async `await client.acall('execute', ..., session_id=...)`",
            ameasure(lambda: client.acall("execute", "print(1)", session_id="s"), calls),
            ref,
        )
    )
    lines.append(
        row(
            "ours, no session (fresh namespace per call)",
            measure(lambda: client.call("execute", "print(1)"), calls),
            ref,
        )
    )
    lines.append("")
    lines.append(
        f"Registration until the first `print(1)` result: ours {ours_first:.2f} s, "
        f"TorchRL {theirs_first:.2f} s (pool_size={pool_size})."
    )
    theirs.reset()
    ours.shutdown()
    return lines


def _load() -> str:
    return " ".join(f"{x:.1f}" for x in os.getloadavg())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--pool-size", type=int, default=2)
    parser.add_argument("--skip-torchrl", action="store_true")
    args = parser.parse_args()
    import ray

    start = time.perf_counter()
    get_services("ray", namespace="bench-init", ray_init_config=RAY_INIT)
    print(f"ray.init: {time.perf_counter() - start:.2f} s; load average {_load()}\n")
    try:
        print("\n".join(bench_trivial(args.calls)))
        print()
        if not args.skip_torchrl:
            print("\n".join(bench_executor(args.calls, args.pool_size)))
        print(f"\nload average at the end: {_load()} (2 cores)")
    finally:
        ray.shutdown()


if __name__ == "__main__":
    main()
