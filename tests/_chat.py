"""Model output for episode tests: Hermes call blocks, server-parsed ``tool_calls``, a tool.

Shared by tests/core (Episode, ToolEnv) and tests/rollout.
"""

from __future__ import annotations

import json
from typing import Any

from toolservices import tool


def hermes(name: str, args: dict[str, Any]) -> str:
    """One Hermes ``<tool_call>`` block (concatenate them for several calls)."""
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': args})}\n</tool_call>"


def server_call(call_id: str, name: str, args: dict[str, Any] | str) -> dict[str, Any]:
    """A ``tool_calls`` entry as a server with a tool parser returns it (``args`` as a
    string: the arguments text as is, e.g. broken JSON)."""
    arguments = args if isinstance(args, str) else json.dumps(args)
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


@tool
def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: First addend.
        b: Second addend.
    """
    return a + b
