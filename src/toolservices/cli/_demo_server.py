"""``toolservices demo --server URL --model NAME``: the demo's scenarios against a real model.

The prompts and tools are the scripted demo's; the assistant turns come
from an OpenAI-compatible endpoint through :class:`toolservices.rollout.Rollout`.
A real model's answers cannot be checked against a script, so the run fails
(non-zero exit) only when an episode could not be played: the server kept
failing or refused a request.
"""

from __future__ import annotations

import sys
import time
from typing import TextIO

import anyio

from toolservices.cli._demo_data import SCENARIOS
from toolservices.cli._demo_tools import DEMO_TOOLS
from toolservices.dispatch import StepMetrics
from toolservices.errors import UserError
from toolservices.rollout import Rollout, Trajectory

__all__ = ["run_server_demo"]

SYSTEM_PROMPT = "You can call tools. Use them when they help, then answer briefly."


async def _run(
    *, server: str, model: str, parser: str | None, api_key: str | None, repeats: int
) -> list[Trajectory]:
    prompts = [s.prompt for _ in range(repeats) for s in SCENARIOS]
    async with Rollout(
        DEMO_TOOLS,
        model=model,
        base_url=server,
        api_key=api_key,
        parser=parser,
        max_turns=4,
        system_prompt=SYSTEM_PROMPT,
        tool_timeout=5.0,
    ) as runner:
        return await runner.arun(prompts)


def run_server_demo(
    *,
    server: str,
    model: str,
    parser: str | None,
    api_key: str | None,
    repeats: int,
    out: TextIO,
) -> int:
    """Run the scenarios against ``server``, print the summary, return the exit code."""
    started = time.perf_counter()
    try:
        trajectories = anyio.run(
            lambda: _run(
                server=server, model=model, parser=parser, api_key=api_key, repeats=repeats
            )
        )
    except UserError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    wall = time.perf_counter() - started
    names = [s.name for _ in range(repeats) for s in SCENARIOS]
    header = (
        f"{'ep':>3}  {'scenario':<9}{'turns':>5}{'calls':>6}{'failed':>7}{'parse':>6}"
        f"{'tool s':>8}{'req':>5}  outcome"
    )
    print(f"server: {server}  model: {model}  parser: {parser or 'server tool_calls'}", file=out)
    print(header, file=out)
    print("-" * len(header), file=out)
    for t, name in zip(trajectories, names, strict=True):
        outcome = t.finish_reason + (f": {t.error}" if t.error else "")
        m = t.metrics
        print(
            f"{t.index:>3}  {name:<9}{m.turns:>5}{m.calls:>6}{m.failed_calls:>7}"
            f"{m.parse_errors:>6}{m.tool_time:>8.3f}{t.requests:>5}  {outcome}",
            file=out,
        )
    totals = sum((t.metrics for t in trajectories), StepMetrics())
    failed = [t for t in trajectories if not t.ok]
    print("-" * len(header), file=out)
    print(
        f"episodes: {len(trajectories)}  calls: {totals.calls}  "
        f"failed calls: {totals.failed_calls}  parse errors: {totals.parse_errors}  "
        f"requests: {sum(t.requests for t in trajectories)}  "
        f"retries: {sum(t.retries for t in trajectories)}",
        file=out,
    )
    print(
        f"tool time (sum over calls): {totals.tool_time:.3f} s  "
        f"request time (sum): {sum(t.request_time for t in trajectories):.3f} s  "
        f"wall time: {wall:.3f} s",
        file=out,
    )
    if failed:
        print(f"{len(failed)} episode(s) could not be played against the server", file=out)
        return 1
    print("all episodes played against the server", file=out)
    return 0
