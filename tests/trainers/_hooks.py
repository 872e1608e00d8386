"""Episode hooks the trainer tests name by import path (``"_hooks:seed"``).

They work on the episode's Python session: ``seed`` sets the counter the
tiny models' code increments, ``score`` reads it after the last turn, so
a test sees both the seeding and the final session state in the reward.
"""

from __future__ import annotations

from typing import Any


async def _counter(episode: Any) -> float:
    result = await episode.python.aexecute("print(n)", session_id=episode.python_session)
    return float(result["stdout"])


async def seed(episode: Any) -> None:
    """Start the counter at the row's ``start``."""
    start = int(episode.state.get("start", 0))
    await episode.python.aexecute(f"n = {start}", session_id=episode.python_session)


async def score(episode: Any) -> float:
    """The counter's final value."""
    return await _counter(episode)


async def report(episode: Any) -> dict[str, Any]:
    """The counter as a score with details."""
    return {"score": await _counter(episode), "passed": ["counter"]}


async def details(episode: Any) -> dict[str, Any]:
    """Details without a score: the trainer's own reward code decides."""
    return {"counter": await _counter(episode)}


def broken(episode: Any) -> None:
    raise RuntimeError("no repository to seed")


async def seed_repo(episode: Any) -> None:
    """Write the task's buggy file into the episode's shell session."""
    text = "def add(a, b):\n    return a - b\n"
    await episode.shell.awrite_file("calc.py", text, session_id=episode.shell_session)


async def hidden_tests(episode: Any) -> float:
    """1.0 when the final workspace's calc.py adds."""
    check = "python3 -c 'from calc import add; assert add(2, 3) == 5'"
    result = await episode.shell.arun(check, session_id=episode.shell_session)
    return 1.0 if result["success"] else 0.0
