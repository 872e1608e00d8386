"""A tool that never returns before its call's time limit, shared by the trainer tests.

Plain module (imported by name from this directory, also by verl's
``module:attr`` tool loader), so it works in every trainer venv.
"""

from __future__ import annotations

import anyio

from toolservices import tool


@tool
async def hang(seconds: float) -> str:
    """Never returns before the call's time limit.

    Args:
        seconds: Ignored.
    """
    await anyio.Event().wait()
    return "unreachable"
