"""A tiny MCP server for the TorchRL transform tests (stdio)."""

from __future__ import annotations

from typing import Annotated

import anyio
from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from pydantic import Field

server = MCPServer("tools")

# Rendezvous groups of ``meet``: calls that arrived, and the event set when all did.
_groups: dict[str, tuple[list[int], anyio.Event]] = {}


@server.tool()
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


@server.tool()
async def meet(group: str, n: int) -> str:
    """Returns once ``n`` calls of ``group`` run at the same time (gives up after 8 s)."""
    arrived, everyone = _groups.setdefault(group, ([0], anyio.Event()))
    arrived[0] += 1
    if arrived[0] == n:
        everyone.set()
    with anyio.move_on_after(8):
        await everyone.wait()
    return f"met {n}" if everyone.is_set() else f"only {arrived[0]} of {n} arrived"


@server.tool()
def calculator(
    operation: Annotated[str, Field(json_schema_extra={"enum": ["add", "multiply"]})],
    a: float,
    b: float,
) -> str:
    """Add or multiply. The schema lists the operations; the server answers others itself."""
    if operation == "add":
        return repr(a + b)
    if operation == "multiply":
        return repr(a * b)
    raise ToolError(f"Unknown operation: {operation}")


@server.tool()
def fail(message: str) -> str:
    """Always raises."""
    raise ToolError(message)


if __name__ == "__main__":
    server.run()
