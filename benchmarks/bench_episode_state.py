"""The cost of ``_state`` write-back: ``Episode.astep`` with one tool that takes ``_state``.

Run: .venv/bin/python benchmarks/bench_episode_state.py
(against an older tree: ``PYTHONPATH=<that tree>/src``, same command)

CPU time (``time.process_time``; the machine is shared), median of blocks of
steps back to back. The tool reads and writes one key, so with write-back
(commit a3b1886) its write persists and is copied back after each call.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

import anyio

from toolservices import Episode, tool

CALL = '<tool_call>\n{"name": "count", "arguments": {}}\n</tool_call>'


@tool
async def count(_state: dict[str, Any]) -> str:
    """Counts its calls in the state."""
    _state["n"] = _state.get("n", 0) + 1
    return "ok"


async def main(blocks: int = 15, steps: int = 200) -> None:
    episode = Episode([count], max_turns=None, end_on_answer=False, state={"a": 1, "b": 2, "c": 3})
    per_step = []
    for _ in range(blocks):
        started = time.process_time()
        for _ in range(steps):
            await episode.astep(CALL)
            episode.messages.clear()
        per_step.append((time.process_time() - started) / steps * 1e6)
    print(
        f"Episode.astep, one async call taking _state: {statistics.median(per_step):.1f} us CPU "
        f"(median of {blocks} blocks of {steps} steps); state at the end: {episode.state}"
    )


if __name__ == "__main__":
    anyio.run(main)
