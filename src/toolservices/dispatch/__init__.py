"""Concurrent execution of parsed tool calls, results and metrics."""

from toolservices.dispatch.dispatcher import Dispatcher, DispatchItem
from toolservices.dispatch.render import render_tool_results, to_openai_messages
from toolservices.dispatch.results import (
    CallResult,
    EpisodeMetrics,
    ItemResult,
    StepMetrics,
    value_text,
)

__all__ = [
    "CallResult",
    "DispatchItem",
    "Dispatcher",
    "EpisodeMetrics",
    "ItemResult",
    "StepMetrics",
    "render_tool_results",
    "to_openai_messages",
    "value_text",
]
