"""``toolservices demo``: a batch of tool-using episodes in eight model formats,
then one shell episode, then one episode on a task image.

Each format gets its own :class:`~toolservices.env.ToolEnv`; all of them step
concurrently, so the wall time shows how calls of different items overlap.
The shell scenario (:mod:`toolservices.cli._demo_shell`) writes a program,
runs its test, fixes it with ``str_replace`` and runs the test again; the image
scenario (:mod:`toolservices.cli._demo_task`) does the same in a repository an
image ships, with the image's pytest. The
run fails (non-zero exit) when any episode does not end as scripted.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, TextIO

import anyio

from toolservices.cli._demo_data import FORMAT_TURNS, SCENARIOS, Scenario
from toolservices.cli._demo_shell import run_shell_demo
from toolservices.cli._demo_task import run_image_demo
from toolservices.cli._demo_tools import DEMO_TOOLS
from toolservices.dispatch import EpisodeMetrics, StepMetrics
from toolservices.env import ToolEnv
from toolservices.tools import ToolRegistry

__all__ = ["EpisodeReport", "run_demo"]


@dataclass(kw_only=True)
class EpisodeReport:
    episode: int
    format: str
    scenario: str
    metrics: EpisodeMetrics
    reason: str
    problem: str | None

    @property
    def ok(self) -> bool:
        return self.problem is None


async def _run_format(fmt: str, repeats: int, first_episode: int) -> list[EpisodeReport]:
    registry = ToolRegistry(DEMO_TOOLS)
    scenarios = [s for _ in range(repeats) for s in SCENARIOS]
    scripts = [turns for _ in range(repeats) for turns in FORMAT_TURNS[fmt]]
    env = ToolEnv(registry, parser=fmt, max_turns=4, timeout=5.0)
    env.reset([s.prompt for s in scenarios])
    first_turn_failed = [False] * len(scenarios)
    turn = 0
    while not all(env.done):
        responses = [
            None if env.done[i] else scripts[i][min(turn, len(scripts[i]) - 1)]
            for i in range(len(scripts))
        ]
        step = await env.astep(responses)
        if turn == 0:
            first_turn_failed = [not m.clean for m in step.metrics]
        turn += 1
    reports = []
    for i, scenario in enumerate(scenarios):
        reports.append(
            EpisodeReport(
                episode=first_episode + i,
                format=fmt,
                scenario=scenario.name,
                metrics=env.metrics[i],
                reason=env.reasons[i] or "running",
                problem=_check(scenario, env.messages[i], env.reasons[i], first_turn_failed[i]),
            )
        )
    return reports


def _check(
    scenario: Scenario, messages: list[dict[str, Any]], reason: str | None, first_failed: bool
) -> str | None:
    if reason != "answered":
        return f"ended with {reason!r} instead of an answer"
    if first_failed != scenario.first_turn_fails:
        return "first turn " + ("succeeded" if not first_failed else "failed") + " unexpectedly"
    tool_text = "\n".join(
        m["content"]
        for m in messages
        if m["role"] == "tool" and not m["content"].startswith("Error:")
    )
    missing = [e for e in scenario.expect if e not in tool_text]
    if missing:
        return f"tool results lack {missing}"
    return None


async def run_demo_async(*, repeats: int = 1) -> list[EpisodeReport]:
    """Run every format's episodes concurrently; reports in episode order."""
    results: dict[str, list[EpisodeReport]] = {}
    per_format = len(SCENARIOS) * repeats

    async def one(index: int, fmt: str) -> None:
        results[fmt] = await _run_format(fmt, repeats, index * per_format)

    async with anyio.create_task_group() as tg:
        for index, fmt in enumerate(FORMAT_TURNS):
            tg.start_soon(one, index, fmt)
    return [report for fmt in FORMAT_TURNS for report in results[fmt]]


def run_demo(*, repeats: int = 1, out: TextIO) -> int:
    """Run the demo, print the summary, return the process exit code."""
    started = time.perf_counter()
    reports = anyio.run(lambda: run_demo_async(repeats=repeats))
    wall = time.perf_counter() - started
    header = (
        f"{'ep':>3}  {'format':<14}{'scenario':<9}{'turns':>5}{'calls':>6}{'failed':>7}"
        f"{'parse':>6}{'tool s':>8}  outcome"
    )
    print(header, file=out)
    print("-" * len(header), file=out)
    for r in reports:
        outcome = f"ok ({r.reason})" if r.ok else f"FAILED: {r.problem}"
        print(
            f"{r.episode:>3}  {r.format:<14}{r.scenario:<9}{r.metrics.turns:>5}"
            f"{r.metrics.calls:>6}{r.metrics.failed_calls:>7}{r.metrics.parse_errors:>6}"
            f"{r.metrics.tool_time:>8.3f}  {outcome}",
            file=out,
        )
    failed = [r for r in reports if not r.ok]
    totals = sum((r.metrics for r in reports), StepMetrics())
    print("-" * len(header), file=out)
    print(
        f"episodes: {len(reports)}  formats: {len(FORMAT_TURNS)}  "
        f"calls: {totals.calls}  failed calls: {totals.failed_calls}  "
        f"parse errors: {totals.parse_errors}",
        file=out,
    )
    print(
        f"tool time (sum over calls): {totals.tool_time:.3f} s  wall time: {wall:.3f} s  "
        f"(concurrency x{totals.tool_time / wall:.1f})",
        file=out,
    )
    if failed:
        print(f"{len(failed)} episode(s) did not end as scripted", file=out)
    else:
        print("all episodes ended as scripted", file=out)
    shell_ok = anyio.run(run_shell_demo, out)
    image_ok = anyio.run(run_image_demo, out)
    return 0 if shell_ok and image_ok and not failed else 1
