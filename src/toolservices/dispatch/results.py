"""Typed outcomes of dispatching tool calls, and the metrics for reward shaping."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any, cast

from toolservices.dispatch._guard import is_real_cancellation
from toolservices.errors import ErrorKind, describe_exception
from toolservices.parsing.base import ParseResult

__all__ = [
    "CallResult",
    "EpisodeMetrics",
    "ItemResult",
    "StepMetrics",
    "safe_value_text",
    "value_text",
]


def value_text(value: Any) -> str:
    """A tool's return value as text a model can read.

    Strings are shown as they are; everything else as indented JSON (the
    format TorchRL's ``<tool_results>`` block uses), with ``str()`` for values
    JSON cannot encode. Raises what ``str()`` raises, and ``RecursionError``
    for absurdly deep values: the dispatcher turns that into a failed call.
    """
    kind = type(value)
    if kind is str:
        return cast(str, value)
    if isinstance(value, str):  # a subclass: its own __str__ may misbehave
        return str.__str__(value)
    if kind is int:
        return str(value)
    if value is None or kind is bool or kind is float:  # indent changes nothing; 4x faster
        return json.dumps(value)
    if isinstance(value, Mapping) and not isinstance(value, dict):
        value = dict(value)  # JSON takes only dicts; show any mapping's items
    try:
        return json.dumps(value, indent=2, default=str)
    except (TypeError, ValueError):
        return str(value)


def safe_value_text(value: Any) -> str:
    """:func:`value_text` that never raises (a placeholder naming the failure instead)."""
    try:
        return value_text(value)
    except BaseException as exc:  # even a __str__ that calls sys.exit()
        if is_real_cancellation(exc, None):
            raise  # a Ctrl-C in the main thread
        return f"<a {type(value).__name__} that cannot be shown as text: {describe_exception(exc)}>"


@dataclass(kw_only=True)
class CallResult:
    """Exactly one of these exists for every parsed call and every parse error."""

    tool: str
    call_id: str
    tag: str | None = None
    #: Position of the call in its response (0-based); parse errors follow the calls.
    index: int = 0
    ok: bool
    value: Any = None
    #: What the model reads when the call failed.
    error: str | None = None
    #: ``unknown_tool``, ``invalid_arguments``, ``tool_failed``, ``timeout``,
    #: ``parse_error``, ``skipped``, ``infrastructure``, ``internal`` (a bug of
    #: this library, logged), or ``tool_error`` for a plain
    #: :class:`~toolservices.errors.ToolError` a tool raised itself.
    error_kind: ErrorKind | None = None
    duration: float = 0.0
    #: The exception behind a failure (the tool's own, or ours for ``internal``),
    #: for logs and debugging; it is not rendered, compared or serialised.
    exception: BaseException | None = field(default=None, compare=False, repr=False)
    #: ``value`` as the model reads it, made once by the dispatcher (``None``:
    #: derived from ``value`` when read).
    text: str | None = field(default=None, compare=False, repr=False)

    @property
    def timed_out(self) -> bool:
        return self.error_kind == "timeout"

    @property
    def content(self) -> str:
        """The text a model sees for this result (never raises)."""
        if self.ok:
            return self.text if self.text is not None else safe_value_text(self.value)
        return self.error or "unknown error"

    def to_dict(self) -> dict[str, Any]:
        """The fields as plain data (without ``exception``, which may not copy)."""
        data = asdict(replace(self, exception=None))
        del data["exception"]
        return data


@dataclass(kw_only=True)
class StepMetrics:
    """Per-item, per-step counts; additive, so episodes sum them."""

    calls: int = 0
    failed_calls: int = 0
    parse_errors: int = 0
    timeouts: int = 0
    tool_time: float = 0.0

    @classmethod
    def from_results(cls, results: list[CallResult]) -> StepMetrics:
        metrics = cls()
        for result in results:
            if result.error_kind == "parse_error":
                metrics.parse_errors += 1
                continue
            metrics.calls += 1
            metrics.tool_time += result.duration
            if not result.ok:
                metrics.failed_calls += 1
            if result.timed_out:
                metrics.timeouts += 1
        return metrics

    def __add__(self, other: StepMetrics) -> StepMetrics:
        return StepMetrics(
            **{name: getattr(self, name) + getattr(other, name) for name in _STEP_FIELDS}
        )

    @property
    def clean(self) -> bool:
        """True when nothing failed and nothing was malformed."""
        return not (self.failed_calls or self.parse_errors)

    def as_dict(self) -> dict[str, float]:
        return asdict(self)


#: The additive counters of :class:`StepMetrics` (what episodes sum).
_STEP_FIELDS = tuple(f.name for f in fields(StepMetrics))


@dataclass(kw_only=True)
class EpisodeMetrics(StepMetrics):
    """Totals over an episode, plus the number of turns that made calls."""

    turns: int = 0
    turns_with_calls: int = 0

    def add_step(self, step: StepMetrics) -> None:
        self.turns += 1
        if step.calls or step.parse_errors:
            self.turns_with_calls += 1
        for name in _STEP_FIELDS:
            setattr(self, name, getattr(self, name) + getattr(step, name))


@dataclass(kw_only=True)
class ItemResult:
    """What happened to one batch item in one step."""

    results: list[CallResult] = field(default_factory=list)
    metrics: StepMetrics = field(default_factory=StepMetrics)
    parse: ParseResult | None = None
    #: True when ``stop_on_error`` stopped the item at a failed call; the calls
    #: after it, if any, are reported as ``skipped``.
    stopped_early: bool = False

    @property
    def has_output(self) -> bool:
        return bool(self.results)
