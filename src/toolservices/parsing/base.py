"""Types shared by every tool-call parser.

A parser turns one model response into the visible text, the ordered tool
calls and the parse errors. It never raises on model output: malformed syntax
becomes a :class:`ParseFailure` whose message the model can learn from.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol, runtime_checkable

from toolservices.errors import UserError

__all__ = [
    "DEFAULT_MAX_CHARS",
    "LLMToolParser",
    "ParseError",
    "ParseFailure",
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
        return _raw_call_id(raw, index, tool)
    payload = json.dumps([index, tool, args], sort_keys=True, default=str)
    return "call_" + hashlib.blake2b(payload.encode(), digest_size=6).hexdigest()


def _raw_hash(raw: str) -> Any:
    """A hash of ``raw`` to finish per call: calls sharing one block hash it once."""
    # surrogatepass: ids must never raise, whatever the text holds.
    return hashlib.blake2b(raw.encode("utf-8", "surrogatepass"), digest_size=6)


def _call_id(raw_hash: Any, index: int, tool: str) -> str:
    finished = raw_hash.copy()
    finished.update(f"\x1f{index}\x1f{tool}".encode("utf-8", "surrogatepass"))
    return "call_" + str(finished.hexdigest())


def _raw_call_id(raw: str, index: int, tool: str) -> str:
    """:func:`_call_id` of :func:`_raw_hash` in one hash: the same bytes, so the same id."""
    data = f"{raw}\x1f{index}\x1f{tool}".encode("utf-8", "surrogatepass")
    return "call_" + hashlib.blake2b(data, digest_size=6).hexdigest()


@dataclass(frozen=True)
class ParseFailure:
    """Something in the response that looked like a call but could not be read.

    A record in :attr:`ParseResult.errors`, never raised (hence not named
    like an exception; ``ParseError`` is the same class under its old name).

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
    #: ``truncated`` (the output stops inside a call), ``invalid_text`` (the
    #: response is not valid Unicode: a lone surrogate), ``too_long`` (the
    #: response is over the parser's ``max_chars``), ``too_many_errors`` (the
    #: scan stopped after :data:`~toolservices.parsing._common.MAX_ERRORS`).
    kind: str = "invalid_syntax"


#: The former name of :class:`ParseFailure` (the same class), kept for existing code.
ParseError = ParseFailure


@dataclass
class ParseResult(Mapping[str, Any]):
    """The outcome of parsing one response.

    Behaves as the mapping of TorchRL's contract: ``result["text"]``,
    ``result["calls"]``, ``result["meta"]``, plus ``result["errors"]``.
    """

    text: str = ""
    calls: list[ToolCall] = field(default_factory=list)
    errors: list[ParseFailure] = field(default_factory=list)
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
    errors: list[ParseFailure] = []
    entries = message["tool_calls"]
    for entry in entries if isinstance(entries, list | tuple) else [entries]:
        try:
            name, args, call_id = call_from_object(entry)
        except ArgumentsError as error:
            raw = json.dumps(entry, default=str)[:2000]
            expected = '{"id": "...", "type": "function", "function": {"name", "arguments"}}'
            errors.append(
                ParseFailure(
                    f"Could not read the tool call: {error.message}. Expected: {expected}",
                    raw,
                    kind=error.kind,
                )
            )
            continue
        calls.append(ToolCall(name, args, None, call_id))
    return ParseResult(response_text(message).strip(), calls, errors)


def _surrogate_call_error(call: ToolCall) -> ParseFailure:
    tool = _SURROGATE.sub("\ufffd", call.tool)
    return ParseFailure(
        f"Could not parse the tool call {tool!r}: its name or arguments hold a lone "
        "surrogate (e.g. a JSON \\ud800 escape without its pair), which is not valid "
        "Unicode. Write the text itself, or a complete surrogate pair.",
        _SURROGATE.sub("\ufffd", (call.raw or "")[:2000]),
        tool,
        "invalid_text",
    )


#: Default :attr:`ToolParser.max_chars`: 16 Mi characters, about four times
#: the text of a one-million-token generation. Parsing is linear in the input,
#: so the cap bounds time and memory for runaway output rather than rescuing
#: a slow parser.
DEFAULT_MAX_CHARS = 16 * 1024 * 1024

_SURROGATE = re.compile("[\ud800-\udfff]")
_ACCEPTED = "a str, a chat message dict (with 'content' or 'text') or None"


def _valid_unicode(text: str) -> bool:
    """False when ``text`` holds a surrogate (UTF-8 cannot encode one)."""
    if text.isascii():
        return True
    try:
        text.encode()
    except UnicodeEncodeError:
        return False
    return True


def _repair_pairs(text: str) -> str:
    """Join surrogate *pairs* into the character they encode (lone halves stay)."""
    return text.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "surrogatepass")


def _has_surrogate(value: Any) -> bool:
    """True when a string anywhere in ``value`` holds a surrogate (not valid Unicode).

    Iterative: decoded arguments can nest deeper than Python's recursion limit.
    """
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            if not item.isascii() and _SURROGATE.search(item) is not None:
                return True
        elif isinstance(item, Mapping):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list | tuple):
            stack.extend(item)
    return False


def check_max_chars(max_chars: int | None) -> int | None:
    """Validate a ``max_chars`` setting (a positive int, or None for no limit)."""
    if max_chars is not None and (
        isinstance(max_chars, bool) or not isinstance(max_chars, int) or max_chars < 1
    ):
        raise UserError(f"max_chars must be a positive int or None (no limit), got {max_chars!r}")
    return max_chars


class ToolParser:
    """Base class of the parser families.

    A chat message dict that already carries a non-empty OpenAI-style
    ``tool_calls`` list (a server parsed them) is read as is, whatever the family.
    Subclasses implement :meth:`_parse` (text -> calls and errors, plus the
    visible text) and :meth:`render` (calls -> the family's own syntax), so
    that every format round-trips. ``tools`` (OpenAI-style specs or a
    registry) lets schema-typed formats convert raw text values.

    The checks every family shares run here, before :meth:`_parse`: the input
    type (a wrong type is the developer's mistake: :class:`UserError`), text
    that is not valid Unicode and text over ``max_chars`` (the model's output:
    a :class:`ParseFailure`, never an exception).
    """

    #: The name under which :func:`toolservices.get_parser` finds the family.
    name: ClassVar[str] = ""
    #: Responses longer than this (in characters) are not parsed: one
    #: ``too_long`` parse error instead. ``None``: no limit.
    max_chars: int | None = DEFAULT_MAX_CHARS

    def __init__(self, *, tools: Any = None, max_chars: int | None = DEFAULT_MAX_CHARS) -> None:
        from toolservices.parsing._schema import ToolSchemas

        self.schemas = ToolSchemas.from_tools(tools)
        self.max_chars = check_max_chars(max_chars)

    def __call__(self, response: str | Mapping[str, Any] | None) -> ParseResult:
        if type(response) is str:  # the usual case, without the ABC check below
            text = response
        elif isinstance(response, Mapping) and response.get("tool_calls"):
            # An OpenAI-style message whose calls a server already parsed.
            return self._finish(_structured_calls(response))
        else:
            text = self._text(response)
        limit = self.max_chars
        if limit is not None and len(text) > limit:
            return self._finish(self._refuse(text, limit))
        if not text.isascii() and not _valid_unicode(text):
            text = _repair_pairs(text)
            lone = _SURROGATE.search(text)
            if lone is not None:
                return self._finish(self._invalid_text(text, lone.start()))
        # Valid text decodes to a surrogate only through an escape (JSON or Python
        # "\ud800"): without one, the calls' arguments need no walk.
        escapes = "\\" in text and ("\\u" in text or "\\U" in text)  # 1 char: memchr-fast
        return self._finish(self._parse(text), check_arguments=escapes)

    def _text(self, response: Any) -> str:
        """The text of ``response``; a type no parser reads is a :class:`UserError`."""
        if isinstance(response, str):
            return response
        if response is None or isinstance(response, Mapping):
            return response_text(response)
        raise UserError(
            f"{type(self).__name__} parses {_ACCEPTED}, got {type(response).__name__}"
            + (" (decode bytes to str first)" if isinstance(response, bytes | bytearray) else "")
        )

    @staticmethod
    def _refuse(text: str, limit: int) -> ParseResult:
        """The ``too_long`` result of ``text``, which is over ``limit`` (:attr:`max_chars`)."""
        message = (
            f"Could not parse the tool calls: the response is {len(text):,} characters long, "
            f"over the limit of {limit:,}; no tool call was read. Write shorter "
            "responses with fewer or smaller calls."
        )
        return ParseResult(text.strip(), [], [ParseFailure(message, text[:2000], kind="too_long")])

    @staticmethod
    def _invalid_text(text: str, position: int) -> ParseResult:
        """One ``invalid_text`` error: a lone surrogate is not a character at all."""
        code = ord(text[position])
        message = (
            f"Could not parse the tool calls: the response is not valid Unicode (a lone "
            f"surrogate U+{code:04X} at character {position}); no tool call was read. "
            "Write the calls again in plain text."
        )
        visible = _SURROGATE.sub("\ufffd", text).strip()
        near = _SURROGATE.sub("\ufffd", text[max(0, position - 100) : position + 100])
        return ParseResult(visible, [], [ParseFailure(message, near, kind="invalid_text")])

    def _finish(self, result: ParseResult, *, check_arguments: bool = True) -> ParseResult:
        """Give every call an id and fill the standard ``meta`` keys.

        A call whose name or arguments hold a surrogate (a JSON ``"\\ud800"``
        escape decodes to one) becomes a parse error: no tool could receive it.
        """
        if check_arguments and any(
            _has_surrogate(call.tool) or _has_surrogate(call.args) for call in result.calls
        ):
            kept: list[ToolCall] = []
            for call in result.calls:
                if _has_surrogate(call.tool) or _has_surrogate(call.args):
                    result.errors.append(_surrogate_call_error(call))
                else:
                    kept.append(call)
            result.calls = kept
        calls = result.calls
        # Calls of one block share its raw text (one object, next to each other):
        # hash it once and finish a copy per call; a call alone hashes in one go.
        shared_raw: str | None = None
        shared_hash: Any = None
        for index, call in enumerate(calls):
            if call.id:
                continue
            raw = call.raw
            if raw is None:
                call.id = make_call_id(index, call.tool, call.args)
            elif raw is shared_raw:
                call.id = _call_id(shared_hash, index, call.tool)
            elif index + 1 < len(calls) and calls[index + 1].raw is raw:
                shared_raw, shared_hash = raw, _raw_hash(raw)
                call.id = _call_id(shared_hash, index, call.tool)
            else:
                call.id = _raw_call_id(raw, index, call.tool)
        meta = result.meta
        meta["count"] = len(calls)
        meta["errors"] = len(result.errors)
        meta["format"] = self.name
        return result

    def parse(self, response: str | Mapping[str, Any] | None) -> ParseResult:
        """Same as calling the parser."""
        return self(response)

    def _parse(self, text: str) -> ParseResult:
        raise NotImplementedError

    def render(self, calls: Sequence[ToolCall], text: str = "") -> str:
        """Write ``calls`` (after optional ``text``) in this family's syntax."""
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"
