"""Episodes: per-step overhead, and what stepping without a batch barrier saves.

Run: .venv/bin/python benchmarks/bench_episodes.py [--quick] [--toolenv-only]

Per-step costs are CPU time (``time.process_time``, all threads of this
process: the machine is shared, so wall time would mostly measure the other
jobs), the median of blocks of steps, each block's steps back to back:

* ``Episode.astep``, one episode, one async no-op call per step (parse,
  dispatch, assistant and tool messages, bookkeeping). Next to it, in the
  same process and interleaved block by block, the anchors: the same parse
  plus ``Dispatcher.arun`` done by hand (the work an episode cannot skip),
  and ``Dispatcher.arun`` of an already parsed call alone.
* ``ToolEnv.step``, batch 32, one no-op call per item, per item; next to it
  the anchor: parse the 32 responses and run them as one ``Dispatcher.arun``
  (what ``ToolEnv`` did before it became a layer over episodes).
  ``--toolenv-only`` runs just this part, so that an older tree without
  ``Episode`` can run it too (``PYTHONPATH=<that tree>/src``).
* No batch barrier: 32 trajectories of 4 turns whose "model" latency per turn
  varies (seeded, 10-100 ms, a sleep before each step) and whose tool takes
  20 ms. Lockstep (``ToolEnv``: every step waits for the slowest item's model
  answer) against independent episodes sharing one dispatcher (each moves on
  as soon as its own answer arrives). Wall time, medians over the repeats.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import anyio

sys.path.insert(0, str(Path(__file__).parent))
from _util import fmt_time  # noqa: E402

from toolservices import Dispatcher, ToolEnv, ToolRegistry, tool  # noqa: E402
from toolservices.parsing import get_parser  # noqa: E402

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


async def cpu_block(fn: Callable[[], Awaitable[object]], steps: int) -> float:
    """CPU seconds per call of ``fn`` over ``steps`` calls back to back."""
    started = time.process_time()
    for _ in range(steps):
        await fn()
    return (time.process_time() - started) / steps


async def step_overhead(blocks: int, steps: int) -> dict[str, float]:
    """Median CPU per step: Episode.astep and its anchors, interleaved block by block."""
    from toolservices import Episode

    episode = Episode([noop], max_turns=None)
    parser = get_parser("hermes", tools=episode.registry)
    dispatcher = Dispatcher(episode.registry)
    parsed = parser(CALL)

    async def by_hand() -> None:
        await dispatcher.arun([parser(CALL)])

    cases: dict[str, Callable[[], Awaitable[object]]] = {
        "episode": lambda: episode.astep(CALL),
        "parse+arun": by_hand,
        "arun": lambda: dispatcher.arun([parsed]),
    }
    samples: dict[str, list[float]] = {name: [] for name in cases}
    for _ in range(blocks):
        for name, fn in cases.items():
            samples[name].append(await cpu_block(fn, steps))
        episode.messages.clear()  # keep the conversation from growing across blocks
    return {name: statistics.median(s) for name, s in samples.items()}


async def toolenv_step(batch: int, blocks: int, steps: int) -> dict[str, float]:
    """Median CPU per item of ToolEnv.astep and of its anchor, interleaved."""
    registry = ToolRegistry([noop])
    parser = get_parser("hermes", tools=registry)
    dispatcher = Dispatcher(registry)
    responses = [CALL] * batch
    env = ToolEnv(registry, max_turns=steps + 1)

    async def anchor() -> None:
        parsed = [parser(r) for r in responses]
        states = [{"batch_index": i, "turn": 1} for i in range(batch)]
        await dispatcher.arun(parsed, states=states)

    samples: dict[str, list[float]] = {"toolenv": [], "parse+arun": []}
    for _ in range(blocks):
        env.reset(["go"] * batch)
        samples["toolenv"].append(await cpu_block(lambda: env.astep(responses), steps) / batch)
        samples["parse+arun"].append(await cpu_block(anchor, steps) / batch)
    return {name: statistics.median(s) for name, s in samples.items()}


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
    from toolservices import Episode

    shared = Dispatcher(ToolRegistry([work]))
    episodes = [Episode(shared.registry, dispatcher=shared, max_turns=None) for _ in plan]

    async def drive(episode: Episode, row: list[float]) -> None:
        for latency in row:
            await anyio.sleep(latency)  # this trajectory's own model answer
            await episode.astep(WORK)

    started = time.perf_counter()
    async with anyio.create_task_group() as tg:
        for episode, row in zip(episodes, plan, strict=True):
            tg.start_soon(drive, episode, row)
    return time.perf_counter() - started


async def main_async(quick: bool, toolenv_only: bool) -> None:
    blocks = 7 if quick else 21
    if not toolenv_only:
        cpu = await step_overhead(blocks, 200)
        print(
            f"Episode.astep, one no-op call: {fmt_time(cpu['episode'])} CPU; "
            f"parse + Dispatcher.arun by hand {fmt_time(cpu['parse+arun'])} "
            f"(x{cpu['episode'] / cpu['parse+arun']:.2f}); "
            f"Dispatcher.arun of a parsed call {fmt_time(cpu['arun'])}"
        )
    env = await toolenv_step(32, blocks, 10)
    print(
        f"ToolEnv.step, batch 32, one no-op call each: {fmt_time(env['toolenv'])} CPU per item; "
        f"parse + one Dispatcher.arun of the batch {fmt_time(env['parse+arun'])} "
        f"(x{env['toolenv'] / env['parse+arun']:.2f})"
    )
    if toolenv_only:
        return
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
    parser.add_argument(
        "--toolenv-only", action="store_true", help="only ToolEnv.step (runs on older trees)"
    )
    args = parser.parse_args()
    anyio.run(main_async, args.quick, args.toolenv_only)


if __name__ == "__main__":
    main()
