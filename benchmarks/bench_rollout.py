"""Rollouts against an OpenAI-compatible server: 256 episodes x 4 turns, a 50 ms tool.

Run: .venv/bin/python benchmarks/bench_rollout.py [--episodes 256] [--repeats 3]

The server is toolservices.rollout.testing.ScriptedChatServer on loopback
(real HTTP, uvicorn, in a child process so that it does not share this
process's interpreter lock) answering every request at once: three turns
that each call a 50 ms tool (Hermes syntax, parsed here), then an answer.
The client is the official openai SDK through toolservices.rollout.Rollout,
all episodes in flight. Reported: the median wall time of the whole rollout
against the sum of tool time over all calls (3 x episodes x 50 ms: what
running the calls one after another costs in tool time alone; the calls'
measured durations, inflated by a busy event loop, are shown too), for an
async tool (asyncio.sleep) and a blocking one (time.sleep, run in worker
threads), plus one row with 20 ms of simulated generation per request.

Baseline, run once: the episodes driven the way TRL's GRPOTrainer drives
tools: in lockstep rounds, each round's generation requests sent as one
concurrent batch (as TRL hands a batch to vLLM), then every completion's
tool calls executed in a plain loop, one after another, before the next round.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio

sys.path.insert(0, str(Path(__file__).parent))
from _util import median  # noqa: E402

from toolservices import tool  # noqa: E402
from toolservices.parsing import get_parser  # noqa: E402
from toolservices.rollout import Rollout  # noqa: E402
from toolservices.rollout.testing import ScriptedChatServer  # noqa: E402

TOOL_SECONDS = 0.05
TURNS = 4  # three tool-calling turns, then the answer


@tool
async def lookup(key: str) -> str:
    """Look a key up (an async service taking 50 ms).

    Args:
        key: What to look up.
    """
    await anyio.sleep(TOOL_SECONDS)
    return f"value of {key}"


@tool
def lookup_blocking(key: str) -> str:
    """Look a key up (blocking code taking 50 ms).

    Args:
        key: What to look up.
    """
    time.sleep(TOOL_SECONDS)
    return f"value of {key}"


def script_for(tool_name: str) -> Any:
    def respond(body: dict[str, Any]) -> str:
        turn = sum(1 for m in body["messages"] if m["role"] == "assistant")
        if turn < TURNS - 1:
            call = {"name": tool_name, "arguments": {"key": f"k{turn}"}}
            return f"<tool_call>\n{json.dumps(call)}\n</tool_call>"
        return "All looked up."

    return respond


async def ours(url: str, tool_fn: Any, episodes: int) -> tuple[float, float, float]:
    """(wall seconds, summed measured tool seconds, client CPU seconds) of one rollout."""
    async with Rollout(
        [tool_fn],
        model="scripted",
        base_url=url,
        parser="hermes",
        max_turns=TURNS,
        max_concurrency=episodes,
        max_tool_concurrency=episodes,
        request_timeout=60.0,
    ) as runner:
        started, cpu = time.perf_counter(), time.process_time()
        trajectories = await runner.arun([f"task {i}" for i in range(episodes)])
        wall, cpu = time.perf_counter() - started, time.process_time() - cpu
    bad = [t for t in trajectories if t.finish_reason != "answered" or t.metrics.calls != 3]
    if bad:
        raise SystemExit(f"{len(bad)} episode(s) went wrong: {bad[0].finish_reason} {bad[0].error}")
    tool_time = sum(t.metrics.tool_time for t in trajectories)
    return wall, tool_time, cpu


async def trl_style(url: str, episodes: int) -> tuple[float, float]:
    """Lockstep rounds: batched generation, then each completion's tools in a plain loop."""
    import openai

    parser = get_parser("hermes")
    tools = {"lookup_blocking": lookup_blocking.fn}
    client = openai.AsyncOpenAI(base_url=url, api_key="EMPTY", max_retries=0)
    conversations = [[{"role": "user", "content": f"task {i}"}] for i in range(episodes)]
    active = list(range(episodes))
    tool_time = 0.0
    started = time.perf_counter()
    while active:
        completions = [None] * len(active)

        async def generate(slot: int, index: int, out: list[Any] = completions) -> None:
            out[slot] = await client.chat.completions.create(
                model="scripted", messages=conversations[index]
            )

        async with anyio.create_task_group() as tg:
            for slot, index in enumerate(active):
                tg.start_soon(generate, slot, index)
        still = []
        for index, completion in zip(active, completions, strict=True):
            text = completion.choices[0].message.content or ""  # type: ignore[attr-defined]
            conversations[index].append({"role": "assistant", "content": text})
            calls = parser(text).calls
            for call in calls:  # one after another, as TRL's loop runs sync tools
                t0 = time.perf_counter()
                result = tools[call.tool](**call.args)
                tool_time += time.perf_counter() - t0
                conversations[index].append({"role": "tool", "content": str(result)})
            if calls:
                still.append(index)
        active = still
    wall = time.perf_counter() - started
    await client.close()
    return wall, tool_time


def serve(tool_name: str, latency: float) -> None:
    """Child-process mode: serve the script, print the URL, stop when stdin closes."""
    with ScriptedChatServer(script_for(tool_name), latency=latency) as server:
        print(server.url, flush=True)
        sys.stdin.read()


@contextlib.contextmanager
def served(tool_name: str, latency: float = 0.0) -> Iterator[str]:
    """The scripted server in a child process (its own CPU, as a real server has)."""
    child = subprocess.Popen(
        [sys.executable, __file__, "--serve", tool_name, str(latency)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    assert child.stdin is not None and child.stdout is not None
    try:
        yield child.stdout.readline().strip()
    finally:
        child.stdin.close()
        try:
            child.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(child.pid, signal.SIGKILL)
            child.wait()


def main() -> None:
    args = argparse.ArgumentParser()
    args.add_argument("--episodes", type=int, default=256)
    args.add_argument("--repeats", type=int, default=3)
    args.add_argument("--skip-baseline", action="store_true")
    args.add_argument("--serve", nargs=2, metavar=("TOOL", "LATENCY"), help=argparse.SUPPRESS)
    opts = args.parse_args()
    if opts.serve:
        serve(opts.serve[0], float(opts.serve[1]))
        return
    n = opts.episodes
    print(f"# {n} episodes x {TURNS} turns ({3 * n} tool calls of {TOOL_SECONDS * 1e3:.0f} ms)")
    # The tool sum is the calls' nominal 50 ms each. Client CPU is this
    # process's CPU time (the server runs in another): it does not depend on
    # how busy the machine is, the wall time does.
    nominal = 3 * n * TOOL_SECONDS
    turns = n * TURNS
    print(
        f"{'case':<48}{'wall':>9}{'tool sum':>10}{'sum/wall':>10}{'wall/turn':>11}{'cpu/turn':>10}"
    )

    def row(label: str, walls: list[float], cpus: list[float]) -> None:
        wall, cpu = median(walls), median(cpus)
        print(
            f"{label:<48}{wall:>8.3f}s{nominal:>9.2f}s{nominal / wall:>9.1f}x"
            f"{wall / turns * 1e3:>9.2f}ms{cpu / turns * 1e3:>8.2f}ms"
        )

    cases = [
        ("ours, async tool", lookup, 0.0),
        ("ours, blocking tool (threads)", lookup_blocking, 0.0),
        ("ours, async tool, 20 ms generation", lookup, 0.02),
    ]
    medians: dict[str, float] = {}
    for label, tool_fn, latency in cases:
        with served(tool_fn.name, latency) as url:
            anyio.run(ours, url, tool_fn, min(n, 8))  # warm up the client and server
            walls, sums, cpus = [], [], []
            for _ in range(opts.repeats):
                wall, tool_sum, cpu = anyio.run(ours, url, tool_fn, n)
                walls.append(wall)
                sums.append(tool_sum)
                cpus.append(cpu)
        medians[label] = statistics.median(walls)
        row(f"{label} (median of {opts.repeats})", walls, cpus)
        print(
            f"    walls: {', '.join(f'{w:.3f}' for w in walls)}; a 50 ms call measured "
            f"{median(sums) / (3 * n) * 1e3:.0f} ms on the busy loop"
        )
    if not opts.skip_baseline:
        with served(lookup_blocking.name) as url:
            cpu = time.process_time()
            wall, _tool_sum = anyio.run(trl_style, url, n)
            cpu = time.process_time() - cpu
        row("TRL-style lockstep, tools in a loop (1 run)", [wall], [cpu])
        ours_blocking = medians["ours, blocking tool (threads)"]
        print(f"    ours (blocking tool) is x{wall / ours_blocking:.1f} faster")


if __name__ == "__main__":
    main()
