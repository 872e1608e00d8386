"""Episodes: per-step overhead, and what stepping without a batch barrier saves.

Run: .venv/bin/python benchmarks/bench_episodes.py [--quick]

* ``Episode.step`` overhead: one episode, one async no-op call per step
  (parse, dispatch, render, bookkeeping), median over many steps; next to it
  ``Dispatcher.arun`` of the same parsed call, the floor without the episode.
* ``ToolEnv.step``, batch 32, one no-op call per item (the lockstep layer).
* No batch barrier: 32 trajectories of 4 turns whose "model" latency per turn
  varies (seeded, 10-100 ms, a sleep before each step) and whose tool takes
  20 ms. Lockstep (``ToolEnv``: every step waits for the slowest item's model
  answer) against independent episodes sharing one dispatcher (each moves on
  as soon as its own answer arrives). Medians over the repeats.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from pathlib import Path

import anyio

sys.path.insert(0, str(Path(__file__).parent))
from _util import fmt_time  # noqa: E402

from toolservices import Dispatcher, Episode, ToolEnv, ToolRegistry, tool  # noqa: E402

CALL = '<tool_call>\n{"name": "noop", "arguments": {"x": 1}}\n</tool_call>'
WORK = '<tool_call>\n{"name": "work", "arguments": {}}\n</tool_call>'


@tool
async def noop(x: int) -> int:
    """Returns x."""
    return x


@tool
async def work() -> str:
    """A 20 ms tool."""
    await anyio.sleep(0.02)
    return "ok"


async def step_overhead(steps: int) -> tuple[float, float]:
    episode = Episode([noop], max_turns=None)
    parsed = episode.parser(CALL)
    dispatcher = Dispatcher(episode.registry)
    ep_samples, floor_samples = [], []
    for _ in range(steps):
        started = time.perf_counter()
        await episode.step(CALL)
        ep_samples.append(time.perf_counter() - started)
        started = time.perf_counter()
        await dispatcher.arun([parsed])
        floor_samples.append(time.perf_counter() - started)
    return statistics.median(ep_samples), statistics.median(floor_samples)


def toolenv_step(batch: int, steps: int) -> float:
    env = ToolEnv([noop], max_turns=steps + 1)
    env.reset(["go"] * batch)
    samples = []
    for _ in range(steps):
        started = time.perf_counter()
        env.step([CALL] * batch)
        samples.append(time.perf_counter() - started)
    return statistics.median(samples)


def latencies(n: int, turns: int, seed: int) -> list[list[float]]:
    rng = random.Random(seed)
    return [[rng.uniform(0.01, 0.1) for _ in range(turns)] for _ in range(n)]


async def lockstep(plan: list[list[float]]) -> float:
    env = ToolEnv([work], max_turns=len(plan[0]) + 1)
    env.reset(["go"] * len(plan))
    started = time.perf_counter()
    for turn in range(len(plan[0])):
        await anyio.sleep(max(row[turn] for row in plan))  # the batch waits for its slowest answer
        await env.astep([WORK] * len(plan))
    return time.perf_counter() - started


async def independent(plan: list[list[float]]) -> float:
    shared = Dispatcher(ToolRegistry([work]))
    episodes = [Episode(shared.registry, dispatcher=shared, max_turns=None) for _ in plan]

    async def drive(episode: Episode, row: list[float]) -> None:
        for latency in row:
            await anyio.sleep(latency)  # this trajectory's own model answer
            await episode.step(WORK)

    started = time.perf_counter()
    async with anyio.create_task_group() as tg:
        for episode, row in zip(episodes, plan, strict=True):
            tg.start_soon(drive, episode, row)
    return time.perf_counter() - started


async def main_async(quick: bool) -> None:
    steps = 300 if quick else 3000
    ep, floor = await step_overhead(steps)
    print(f"Episode.step, one no-op call: {fmt_time(ep)}", end=" ")
    print(f"(Dispatcher.arun alone: {fmt_time(floor)})")
    print(f"ToolEnv.step, batch 32, one no-op call each: {fmt_time(toolenv_step(32, steps // 10))}")
    repeats = 3 if quick else 7
    locked, free = [], []
    for seed in range(repeats):
        plan = latencies(32, 4, seed)
        locked.append(await lockstep(plan))
        free.append(await independent(plan))
    bound = statistics.median(max(sum(row) for row in latencies(32, 4, s)) for s in range(repeats))
    lo, fr = statistics.median(locked), statistics.median(free)
    print(
        f"32 trajectories x 4 turns, model 10-100 ms + tool 20 ms: lockstep {fmt_time(lo)}, "
        f"independent episodes {fmt_time(fr)} ({lo / fr:.2f}x); slowest trajectory's model "
        f"time alone {fmt_time(bound)}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="fewer repeats (a smoke run)")
    args = parser.parse_args()
    anyio.run(main_async, args.quick)


if __name__ == "__main__":
    main()
