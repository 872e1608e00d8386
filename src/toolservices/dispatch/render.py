"""Rendering of call results for the model: one place, three shapes."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from toolservices.dispatch.results import CallResult

__all__ = ["render_tool_results", "to_openai_messages"]


def render_tool_results(results: Sequence[CallResult]) -> str:
    """The ``<tool_results>`` block of TorchRL's ``ExecuteToolsInOrder``.

    Numbering is 1-based in order of appearance; the tag, when the model gave
    one, follows the call number. An empty sequence renders as ``""``.
    """
    if not results:
        return ""
    lines = ["<tool_results>"]
    for number, result in enumerate(results, start=1):
        header = f"Tool {result.tool} (call {number})"
        if result.tag:
            header += f" [tag: {result.tag}]"
        if result.ok:
            lines.append(f"{header} succeeded:")
            lines.append(f"  Result: {result.content}")
        else:
            lines.append(f"{header} failed:")
            lines.append(f"  Error: {result.content}")
    lines.append("</tool_results>")
    return "\n".join(lines)


def to_openai_messages(results: Sequence[CallResult]) -> list[dict[str, Any]]:
    """One OpenAI-style ``{"role": "tool", ...}`` message per result."""
    messages: list[dict[str, Any]] = []
    for result in results:
        content = result.content if result.ok else f"Error: {result.content}"
        messages.append(
            {
                "role": "tool",
                "tool_call_id": result.call_id,
                "name": result.tool,
                "content": content,
            }
        )
    return messages
