"""Rendering of call results for the model: one function per output format.

* ``tool_results``: :func:`render_tool_results`, TorchRL's block, one message per turn;
* ``openai``: :func:`openai_content` per result (:func:`to_openai_messages` wraps
  it into ``{"role": "tool", ...}`` messages);
* ``simple``: :func:`render_simple`, TorchRL's ``SimpleToolTransform`` and
  ``MCPToolTransform`` text, one message per call.

Every layer (ToolEnv, Episode, the TorchRL transforms) renders through these,
and none of them raises: a value or an exception that cannot be turned into
text is described instead.

A tool's exception reads ``Type: message`` (:attr:`CallResult.error`) except
in the two formats TorchRL defined, ``tool_results`` and ``simple``, which
show the message alone as TorchRL does (the compatibility contract pins
their text); an exception without a message still shows its type there.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from toolservices.dispatch._guard import is_real_cancellation
from toolservices.dispatch.results import CallResult
from toolservices.errors import describe_exception

__all__ = ["openai_content", "render_simple", "render_tool_results", "to_openai_messages"]


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
            lines.append(f"  Error: {_torchrl_error(result)}")
    lines.append("</tool_results>")
    return "\n".join(lines)


def openai_content(result: CallResult) -> str:
    """The content of the OpenAI-style tool message answering ``result``."""
    return result.content if result.ok else f"Error: {result.content}"


def to_openai_messages(results: Sequence[CallResult]) -> list[dict[str, Any]]:
    """One OpenAI-style ``{"role": "tool", ...}`` message per result."""
    return [
        {
            "role": "tool",
            "tool_call_id": result.call_id,
            "name": result.tool,
            "content": openai_content(result),
        }
        for result in results
    ]


def render_simple(result: CallResult, *, available: Iterable[str] = (), name: str = "") -> str:
    """TorchRL's ``Tool NAME executed successfully:`` / ``Tool NAME failed:`` text.

    A value is shown with ``str()`` as TorchRL does (not JSON); ``available``
    lists the tools named when the model called an unknown one; ``name``
    overrides the tool name shown.
    """
    tool = name or result.tool
    if result.ok:
        return f"Tool {tool} executed successfully:\n{_str(result)}"
    error = _torchrl_error(result)
    if result.error_kind == "unknown_tool":
        error = f"Tool {tool} not found. Available tools: {', '.join(available) or 'none'}"
    elif result.error_kind == "tool_failed":
        error = f"Tool execution failed: {error}"
    return f"Tool {tool} failed:\n{error}"


def _torchrl_error(result: CallResult) -> str:
    """A failure as TorchRL's formats show it: a tool's exception by its message alone."""
    error = result.content
    exc = result.exception
    if result.error_kind == "tool_failed" and exc is not None:
        prefix = f"{type(exc).__name__}: "
        if error == describe_exception(exc) and error.startswith(prefix):
            return error[len(prefix) :]
    return error


def _str(result: CallResult) -> str:
    value = result.value
    if isinstance(value, str):
        return result.content
    try:
        return str(value)
    except BaseException as exc:  # a container holding an object whose repr() fails
        if is_real_cancellation(exc, None):
            raise  # a Ctrl-C in the main thread
        return f"<a {type(value).__name__} that str() cannot show: {describe_exception(exc)}>"
