"""Bounded waits for state another task, thread or process is about to reach.

Where the code under test offers no event to wait on (a queue count, a gate's
waiters, a pool refilled in the background), tests poll its state through
these: each wait has a deadline and fails with ``TimeoutError`` naming what
did not happen, instead of hanging until the suite's timeout.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

#: Generous: these conditions hold within milliseconds on an idle machine.
WAIT = 10.0


async def until(condition: Callable[[], bool], *, within: float = WAIT, step: float = 0) -> None:
    """Yield to the event loop (``step`` seconds at a time) until ``condition()`` holds."""
    deadline = time.monotonic() + within
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"not reached within {within} s: {condition.__doc__ or condition}")
        await asyncio.sleep(step)


def wait_until(condition: Callable[[], bool], *, within: float = WAIT, step: float = 0.005) -> None:
    """Block (``step`` seconds at a time) until ``condition()`` holds."""
    deadline = time.monotonic() + within
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"not reached within {within} s: {condition.__doc__ or condition}")
        time.sleep(step)
