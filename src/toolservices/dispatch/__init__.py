"""Concurrent execution of parsed tool calls, results and metrics."""

from toolservices.dispatch._bound import ConcurrencyBound
from toolservices.dispatch._state import EpisodeState
from toolservices.dispatch.dispatcher import (
    DEFAULT_MAX_ABANDONED_THREADS,
    Dispatcher,
    DispatchItem,
    call_id_of,
)
from toolservices.dispatch.render import (
    openai_content,
    render_simple,
    render_tool_results,
    to_openai_messages,
)
from toolservices.dispatch.results import (
    CallResult,
    EpisodeMetrics,
    ItemResult,
    StepMetrics,
    safe_value_text,
    value_text,
)

__all__ = [
    "DEFAULT_MAX_ABANDONED_THREADS",
    "CallResult",
    "ConcurrencyBound",
    "DispatchItem",
    "Dispatcher",
    "EpisodeMetrics",
    "EpisodeState",
    "ItemResult",
    "StepMetrics",
    "call_id_of",
    "openai_content",
    "render_simple",
    "render_tool_results",
    "safe_value_text",
    "to_openai_messages",
    "value_text",
]
