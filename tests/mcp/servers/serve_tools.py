"""Serves a few plain function tools through toolservices.mcp.serve (stdio or HTTP).

``serve_tools.py http`` binds a free port on 127.0.0.1 and reports its URL on
stderr (``toolservices MCP server ready: <url>``).
"""

from __future__ import annotations

import sys

import anyio

from toolservices.mcp import serve
from toolservices.mcp._server import _announce
from toolservices.tools import tool


@tool
def multiply(a: int, b: int) -> int:
    """Multiply two integers."""
    return a * b


@tool
async def slow_echo(text: str, seconds: float = 0.0) -> str:
    """Echo text after a pause."""
    await anyio.sleep(seconds)
    return text


_gates: dict[str, anyio.Event] = {}


def _gate(name: str) -> anyio.Event:
    return _gates.setdefault(name, anyio.Event())


@tool
async def wait_for(gate: str) -> str:
    """Return once release(gate) was called (a rendezvous for tests)."""
    await _gate(gate).wait()
    return f"{gate} passed"


@tool
async def release(gate: str) -> str:
    """Let wait_for(gate) return."""
    _gate(gate).set()
    return "released"


@tool
def explode(message: str) -> str:
    """Always raise."""
    raise RuntimeError(message)


@tool
def describe(values: list[float]) -> dict[str, float]:
    """Count and sum of a list of numbers."""
    return {"count": len(values), "sum": sum(values)}


if __name__ == "__main__":
    transport = sys.argv[1] if len(sys.argv) > 1 else "stdio"
    serve(
        [multiply, slow_echo, explode, describe, wait_for, release],
        transport=transport,  # type: ignore[arg-type]
        port=0,
        on_ready=_announce,
    )
