"""Types shared by every tool-call parser.

A parser turns one model response into the visible text, the ordered tool
calls and the parse errors. It never raises on model output: malformed syntax
becomes a :class:`ParseError` whose message the model can learn from.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol, runtime_checkable

__all__ = [
    "LLMToolParser",
    "ParseError",
    "ParseResult",
    "ToolCall",
    "ToolParser",
    "make_call_id",
    "response_text",
]


@dataclass
class ToolCall:
    """One tool call as the model wrote it.

    The first three fields keep TorchRL's positional order
    (``ToolCall(tool, args, tag=None)``); the rest are additions with defaults.
    """

    tool: str
    args: dict[str, Any]
    tag: str | None = None
    #: The model's own call id where the format carries one, else a stable
    #: id derived from the call's position and content.
    id: str = ""
    #: The exact source text of the call, when the parser knows it.
    raw: str | None = None

    @property
    def name(self) -> str:
        """Alias of :attr:`tool`, the name most chat APIs use."""
        return self.tool


def make_call_id(index: int, tool: str, args: Mapping[str, Any], *, raw: str | None = None) -> str:
    """A stable id for a call without one: same response, same ids.

    When the call's source text ``raw`` is known it is hashed instead of the
    arguments (cheaper than serialising them, and just as stable).
    """
    if raw is not None:
        payload = f"{index}\x1f{tool}\x1f{raw}"
    else:
        payload = json.dumps([index, tool, args], sort_keys=True, default=str)
    return "call_" + hashlib.blake2b(payload.encode(), digest_size=6).hexdigest()


@dataclass(frozen=True)
class ParseError:
    """Something in the response that looked like a call but could not be read.

    ``message`` is written for the model: it says what was wrong and what the
    expected syntax is.
    """

    message: str
    #: The offending source text (possibly cut), for logs and debugging.
    raw: str = ""
    #: The tool name when it could be recovered.
    tool: str | None = None
    #: A short label: ``invalid_json`` (bad JSON or arguments that are not an
    #: object), ``invalid_syntax`` (the call syntax itself is wrong),
    #: ``truncated`` (the output stops inside a call).
    kind: str = "invalid_syntax"


@dataclass
class ParseResult(Mapping[str, Any]):
    """The outcome of parsing one response.

    Behaves as the mapping of TorchRL's contract: ``result["text"]``,
    ``result["calls"]``, ``result["meta"]``, plus ``result["errors"]``.
    """

    text: str = ""
    calls: list[ToolCall] = field(default_factory=list)
    errors: list[ParseError] = field(default_factory=list)
    meta: dict[str, Any] = field(default_factory=dict)

    _KEYS: ClassVar[tuple[str, ...]] = ("text", "calls", "meta", "errors")

    def __post_init__(self) -> None:
        self.meta.setdefault("count", len(self.calls))
        self.meta.setdefault("errors", len(self.errors))

    def __getitem__(self, key: str) -> Any:
        if key not in self._KEYS:
            raise KeyError(key)
        return getattr(self, key)

    def __iter__(self) -> Iterator[str]:
        return iter(self._KEYS)

    def __len__(self) -> int:
        return len(self._KEYS)

    @property
    def ok(self) -> bool:
        """True when the response had no parse errors."""
        return not self.errors


@runtime_checkable
class LLMToolParser(Protocol):
    """TorchRL's parser protocol: ``parser(response) -> ParseResult``."""

    def __call__(self, response: str | dict[str, Any]) -> ParseResult: ...


def response_text(response: str | Mapping[str, Any] | None) -> str:
    """The text of a response given as a string or a chat message dict."""
    if response is None:
        return ""
    if isinstance(response, str):
        return response
    for key in ("text", "content"):
        value = response.get(key)
        if isinstance(value, str):
            return value
        if isinstance(value, list):  # OpenAI content parts: keep the text parts
            return "".join(
                part["text"]
                for part in value
                if isinstance(part, Mapping) and isinstance(part.get("text"), str)
            )
    return ""


def _structured_calls(message: Mapping[str, Any]) -> ParseResult:
    """Read ``message["tool_calls"]`` (OpenAI shape), with the shared JSON policy."""
    from toolservices.parsing._json import ArgumentsError, call_from_object

    calls: list[ToolCall] = []
    errors: list[ParseError] = []
    entries = message["tool_calls"]
    for entry in entries if isinstance(entries, list | tuple) else [entries]:
        try:
            name, args, call_id = call_from_object(entry)
        except ArgumentsError as error:
            raw = json.dumps(entry, default=str)[:2000]
            expected = '{"id": "...", "type": "function", "function": {"name", "arguments"}}'
            errors.append(
                ParseError(
                    f"Could not read the tool call: {error.message}. Expected: {expected}",
                    raw,
                    kind=error.kind,
                )
            )
            continue
        calls.append(ToolCall(name, args, None, call_id))
    return ParseResult(response_text(message).strip(), calls, errors)


class ToolParser:
    """Base class of the parser families.

    A chat message dict that already carries a non-empty OpenAI-style
    ``tool_calls`` list (a server parsed them) is read as is, whatever the family.
    Subclasses implement :meth:`_parse` (text -> calls and errors, plus the
    visible text) and :meth:`render` (calls -> the family's own syntax), so
    that every format round-trips. ``tools`` (OpenAI-style specs or a
    registry) lets schema-typed formats convert raw text values.
    """

    #: The name under which :func:`toolservices.get_parser` finds the family.
    name: ClassVar[str] = ""

    def __init__(self, *, tools: Any = None) -> None:
        from toolservices.parsing._schema import ToolSchemas

        self.schemas = ToolSchemas.from_tools(tools)

    def __call__(self, response: str | dict[str, Any]) -> ParseResult:
        if isinstance(response, Mapping) and response.get("tool_calls"):
            # An OpenAI-style message whose calls a server already parsed.
            return self._finish(_structured_calls(response))
        return self._finish(self._parse(response_text(response)))

    def _finish(self, result: ParseResult) -> ParseResult:
        """Give every call an id and fill the standard ``meta`` keys."""
        for index, call in enumerate(result.calls):
            if not call.id:
                call.id = make_call_id(index, call.tool, call.args, raw=call.raw)
        result.meta["count"] = len(result.calls)
        result.meta["errors"] = len(result.errors)
        result.meta["format"] = self.name
        return result

    def parse(self, response: str | dict[str, Any]) -> ParseResult:
        """Same as calling the parser."""
        return self(response)

    def _parse(self, text: str) -> ParseResult:
        raise NotImplementedError

    def render(self, calls: Sequence[ToolCall], text: str = "") -> str:
        """Write ``calls`` (after optional ``text``) in this family's syntax."""
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"
