"""Dispatch overhead per call: no-op tools through the Dispatcher.

Run: .venv/bin/python benchmarks/bench_dispatch.py [--limiter-only]

Reports the median wall time of one batch and the overhead per call (batch
time / calls) for sync and async no-op tools, through the async entry point
(``arun`` inside a running loop) and the sync one (``run``, which hops to the
shared background loop). A direct Python call of the same function is the
floor; TorchRL 0.14.1's ExecuteToolsInOrder loop is not run here because it
needs a ChatEnv (see bench_torchrl.py for the env.step comparison).

Last, the CPU time (``time.process_time``; the machine is shared) of one
async no-op call through ``arun``, without and with a shared
``CapacityLimiter`` (``limiter=``, what episodes sharing a dispatcher pass),
interleaved in blocks; medians of the blocks.
"""

from __future__ import annotations

import functools
import statistics
import sys
import time
from pathlib import Path

import anyio

sys.path.insert(0, str(Path(__file__).parent))
from _util import fmt_time, measure  # noqa: E402

from toolservices import Dispatcher, ToolCall, ToolRegistry, tool  # noqa: E402


@tool
def noop(x: int) -> int:
    return x


@tool
async def anoop(x: int) -> int:
    return x


def main() -> None:
    registry = ToolRegistry([noop, anoop])
    dispatcher = Dispatcher(registry)
    repeats = 200
    print(f"{'case':<34}{'batch median':>14}{'per call':>12}")
    floor = statistics.median(measure(lambda: noop.fn(x=1), repeats=10000))
    print(f"{'direct python call':<34}{fmt_time(floor):>14}{fmt_time(floor):>12}")
    for name in ("noop", "anoop"):
        for batch, per_item in ((1, 1), (8, 1), (64, 1), (8, 4)):
            items = [[ToolCall(name, {"x": k}) for k in range(per_item)] for _ in range(batch)]
            calls = batch * per_item
            sync = statistics.median(
                measure(functools.partial(dispatcher.run, items), repeats=repeats)
            )
            label = f"{name} run()   {batch:>2} items x {per_item}"
            print(f"{label:<34}{fmt_time(sync):>14}{fmt_time(sync / calls):>12}")

            async def in_loop(items: list = items) -> float:
                async def once() -> None:
                    await dispatcher.arun(items)

                samples = []
                for _ in range(repeats + 3):
                    started = anyio.current_time()
                    await once()
                    samples.append(anyio.current_time() - started)
                return statistics.median(samples[3:])

            native = anyio.run(in_loop)
            label = f"{name} arun()  {batch:>2} items x {per_item}"
            print(f"{label:<34}{fmt_time(native):>14}{fmt_time(native / calls):>12}")


async def limiter_cpu(blocks: int = 21, steps: int = 500) -> dict[str, float]:
    """CPU seconds per one-call ``arun`` of ``anoop``, without and with a shared limiter."""
    dispatcher = Dispatcher(ToolRegistry([anoop]))
    items = [[ToolCall("anoop", {"x": 1})]]
    limiter = anyio.CapacityLimiter(dispatcher.max_concurrency)
    cases = {
        "no limiter": lambda: dispatcher.arun(items),
        "shared limiter": lambda: dispatcher.arun(items, limiter=limiter),
    }
    samples: dict[str, list[float]] = {name: [] for name in cases}
    for _ in range(blocks):
        for name, fn in cases.items():
            started = time.process_time()
            for _ in range(steps):
                await fn()
            samples[name].append((time.process_time() - started) / steps)
    return {name: statistics.median(s) for name, s in samples.items()}


if __name__ == "__main__":
    if "--limiter-only" not in sys.argv:
        main()
    cpu = anyio.run(limiter_cpu)
    print(
        "anoop arun() 1 call, CPU: "
        + ", ".join(f"{name} {fmt_time(value)}" for name, value in cpu.items())
    )
