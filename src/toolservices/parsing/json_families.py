"""Families whose calls are JSON objects ``{"name", "arguments"}``.

Two shapes cover most of them, so each family is a few class attributes:

* :class:`TaggedJSONParser`: ``OPEN json CLOSE`` blocks (Hermes/Qwen
  ``<tool_call>``, Jamba/Hunyuan/MiniMax-M1 ``<tool_calls>``, LongCat,
  ERNIE, InternLM). A block holds one object, several objects (newline or
  ``;`` separated) or an array of them. A block whose closing tag never came
  is still accepted when its JSON is complete (the generation stopped right
  after it); otherwise it is reported as truncated.
* :class:`MarkerJSONParser`: ``MARKER json`` with no closing tag (Granite,
  granite-20b-fc, Phi-4-mini ``functools``, GigaChat 3.1).

``llama3_json`` (bare objects in prose), ``mistral`` (``[TOOL_CALLS]`` in its
two generations) and ``xlam`` (four wrappings) have their own scanners.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any, ClassVar, Literal

from toolservices.errors import UserError
from toolservices.parsing._common import Collector, SyntaxParser, after_text, iter_blocks
from toolservices.parsing._json import (
    ArgumentsError,
    NestingError,
    call_from_object,
    describe,
    dumps,
    raw_decode,
)
from toolservices.parsing.base import DEFAULT_MAX_CHARS, ToolCall

__all__ = [
    "ErnieParser",
    "GigaChat3Parser",
    "Granite20bFCParser",
    "GraniteParser",
    "HermesParser",
    "HunyuanParser",
    "InternLMParser",
    "JambaParser",
    "Llama3JSONParser",
    "LongcatParser",
    "MiniMaxM1Parser",
    "MistralParser",
    "Phi4MiniParser",
    "TaggedJSONParser",
    "XLAMParser",
    "read_calls",
]

_SEPARATORS = " \t\r\n,;"

Call = tuple[str, dict[str, Any], str]


def read_calls(body: str, *, args_keys: Sequence[str] = ("arguments", "parameters")) -> list[Call]:
    """Every call in ``body``: objects and/or arrays of objects, separated by blanks/``,``/``;``."""
    calls: list[Call] = []
    pos, size = 0, len(body)
    while True:
        while pos < size and body[pos] in _SEPARATORS:
            pos += 1
        if pos >= size:
            break
        value, pos = raw_decode(body, pos)
        for item in value if isinstance(value, list) else [value]:
            calls.append(call_from_object(item, args_keys=args_keys))
    if not calls:
        raise ArgumentsError("the block is empty: it must hold a JSON call object")
    return calls


def scan_tagged(text: str, found: Collector, open_tag: str, close_tag: str) -> None:
    """Collect the calls of every ``open_tag json close_tag`` block."""
    for block in iter_blocks(text, open_tag, close_tag):
        raw = text[block.start : block.end]
        try:
            calls = read_calls(block.body(text))
        except ArgumentsError as error:
            if not block.closed:
                error = ArgumentsError(
                    f"the {open_tag} block is never closed with {close_tag} "
                    f"and its content is incomplete (truncated?): {error.message}",
                    truncated=True,
                )
            elif error.truncated:  # closed block: a bracket is missing, not a cut-off
                error = ArgumentsError(f"invalid JSON: {error.message}")
            found.arguments_error(error, raw)
            continue
        for name, args, call_id in calls:
            found.call(name, args, id=call_id, raw=raw)
        found.cut(block.start, block.end)


def _object(call: ToolCall, args_key: str) -> dict[str, Any]:
    return {"name": call.tool, args_key: call.args}


class TaggedJSONParser(SyntaxParser):
    """``OPEN {json call} CLOSE`` blocks (see the module docstring)."""

    open_tag: ClassVar[str] = "<tool_call>"
    close_tag: ClassVar[str] = "</tool_call>"
    args_key: ClassVar[str] = "arguments"
    #: How :meth:`render` writes the calls: one block per call, or one block
    #: holding a JSON array, or one block with one object per line.
    render_style: ClassVar[Literal["blocks", "array", "lines"]] = "blocks"

    def _scan(self, text: str, found: Collector) -> None:
        scan_tagged(text, found, self.open_tag, self.close_tag)

    def near_miss_markers(self) -> tuple[str, ...]:
        return (self.open_tag, self.close_tag)  # a stray closing tag: the opening is missing

    def render(self, calls: Sequence[ToolCall], text: str = "") -> str:
        objects = [_object(call, self.args_key) for call in calls]
        if self.render_style == "array":
            out = f"{self.open_tag}{dumps(objects)}{self.close_tag}"
        elif self.render_style == "lines":
            lines = "\n".join(dumps(obj) for obj in objects)
            out = f"{self.open_tag}\n{lines}\n{self.close_tag}"
        else:
            out = "\n".join(f"{self.open_tag}\n{dumps(obj)}\n{self.close_tag}" for obj in objects)
        return after_text(text, out)


class HermesParser(TaggedJSONParser):
    """Hermes 2 Pro/3, Qwen2.5, Qwen3, QwQ: ``<tool_call>{json}</tool_call>``."""

    name = "hermes"
    syntax = '<tool_call>\n{"name": "TOOL_NAME", "arguments": {"arg": "value"}}\n</tool_call>'


class ErnieParser(HermesParser):
    """ERNIE-4.5: Hermes-style blocks."""

    name = "ernie45"


class LongcatParser(TaggedJSONParser):
    """Meituan LongCat-Flash: Hermes-style JSON in ``<longcat_tool_call>``."""

    name = "longcat"
    open_tag = "<longcat_tool_call>"
    close_tag = "</longcat_tool_call>"
    syntax = '<longcat_tool_call>\n{"name": "TOOL_NAME", "arguments": {}}\n</longcat_tool_call>'


class JambaParser(TaggedJSONParser):
    """AI21 Jamba 1.5+: ``<tool_calls>[{name, arguments}, ...]</tool_calls>``."""

    name = "jamba"
    open_tag = "<tool_calls>"
    close_tag = "</tool_calls>"
    render_style: ClassVar[Literal["blocks", "array", "lines"]] = "array"
    syntax = '<tool_calls>[{"name": "TOOL_NAME", "arguments": {"arg": "value"}}]</tool_calls>'


class HunyuanParser(JambaParser):
    """Tencent Hunyuan-A13B: same syntax as Jamba."""

    name = "hunyuan_a13b"


class MiniMaxM1Parser(JambaParser):
    """MiniMax-M1: ``<tool_calls>`` with one single-line JSON object per line."""

    name = "minimax"
    render_style: ClassVar[Literal["blocks", "array", "lines"]] = "lines"
    syntax = '<tool_calls>\n{"name": "TOOL_NAME", "arguments": {"arg": "value"}}\n</tool_calls>'


class InternLMParser(TaggedJSONParser):
    """InternLM2/2.5: ``<|action_start|><|plugin|>{name, parameters}<|action_end|>``."""

    name = "internlm"
    open_tag = "<|action_start|><|plugin|>"
    close_tag = "<|action_end|>"
    args_key = "parameters"
    syntax = '<|action_start|><|plugin|>\n{"name": "TOOL_NAME", "parameters": {}}<|action_end|>'


class MarkerJSONParser(SyntaxParser):
    """``MARKER json`` with no closing tag: the JSON value ends the call."""

    markers: ClassVar[tuple[str, ...]] = ()
    args_key: ClassVar[str] = "arguments"
    #: Render one marker per call, or one marker and a JSON array.
    render_array: ClassVar[bool] = True
    #: What :meth:`render` writes before the JSON (default: the first marker).
    render_prefix: ClassVar[str] = ""
    _pattern: ClassVar[re.Pattern[str]]

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls._pattern = re.compile("|".join(map(re.escape, cls.markers)))

    def near_miss_markers(self) -> tuple[str, ...]:
        return self.markers

    def _scan(self, text: str, found: Collector) -> None:
        pos = 0
        while (match := self._pattern.search(text, pos)) is not None:
            try:
                value, end = raw_decode(text, match.end())
                items = value if isinstance(value, list) else [value]
                calls = [call_from_object(item) for item in items]
            except ArgumentsError as error:
                found.arguments_error(error, text[match.start() : match.start() + 2000])
                pos = match.end()
                continue
            raw = text[match.start() : end]  # one object for all: hashed once for the ids
            for name, args, call_id in calls:
                found.call(name, args, id=call_id, raw=raw)
            found.cut(match.start(), end)
            pos = end

    def render(self, calls: Sequence[ToolCall], text: str = "") -> str:
        marker = self.render_prefix or self.markers[0]
        objects = [_object(call, self.args_key) for call in calls]
        if self.render_array:
            out = f"{marker}{dumps(objects)}"
        else:
            out = "\n".join(f"{marker}{dumps(obj)}" for obj in objects)
        return after_text(text, out)


class GraniteParser(MarkerJSONParser):
    """Granite 3.0 (``<|tool_call|>``) and 3.1+ (``<tool_call>``) + a JSON array."""

    name = "granite"
    markers = ("<|tool_call|>", "<tool_call>")
    syntax = '<|tool_call|>[{"name": "TOOL_NAME", "arguments": {"arg": "value"}}]'


class Granite20bFCParser(MarkerJSONParser):
    """granite-20b-functioncalling: ``<function_call> {json}`` per call."""

    name = "granite-20b-fc"
    markers = ("<function_call>",)
    render_array = False
    render_prefix = "<function_call> "
    syntax = '<function_call> {"name": "TOOL_NAME", "arguments": {"arg": "value"}}'


class Phi4MiniParser(MarkerJSONParser):
    """Phi-4-mini-instruct: the literal ``functools`` + a JSON array."""

    name = "phi4_mini_json"
    markers = ("functools",)
    syntax = 'functools[{"name": "TOOL_NAME", "arguments": {"arg": "value"}}]'


class GigaChat3Parser(MarkerJSONParser):
    """GigaChat 3.1 (``<|function_call|>{...}``) and 3 (``function call<|role_sep|>``)."""

    name = "gigachat3"
    markers = ("<|function_call|>", "function call<|role_sep|>")
    render_array = False
    syntax = '<|function_call|>{"name": "TOOL_NAME", "arguments": {"arg": "value"}}'


# --- llama3_json ------------------------------------------------------------------

# Call objects start with one of these keys; other objects are prose (never decoded).
_CALL_START = re.compile(r'\{\s*"(?:name|type|function|parameters|arguments)"\s*:')
_PYTHON_TAG = "<|python_tag|>"


def _is_call(value: Any) -> bool:
    """``{"name", "parameters"|"arguments"}``, or the OpenAI ``{"function": {...}}`` shape."""
    if isinstance(value, dict) and isinstance(value.get("function"), dict):
        value = value["function"]
    return (
        isinstance(value, dict)
        and "name" in value
        and ("parameters" in value or "arguments" in value)
    )


class Llama3JSONParser(SyntaxParser):
    """Llama 3.x / 4 JSON mode: bare ``{"name", "parameters"}`` objects in prose.

    Any JSON object with a string ``name`` and ``parameters`` (or
    ``arguments``) is a call; calls may be separated by ``;`` or newlines;
    ``<|python_tag|>`` is dropped. Other JSON objects stay in the text.
    """

    name = "llama3_json"
    syntax = '{"name": "TOOL_NAME", "parameters": {"arg": "value"}}'

    def near_miss_markers(self) -> tuple[str, ...]:
        # A call object that is not one: Python quotes, or no "name".
        return ('"parameters"', "'parameters'", "'arguments'")

    def _scan(self, text: str, found: Collector) -> None:
        self._read(text, found)
        if not found.calls and not found.errors and _PYTHON_TAG in text:
            found.error(f"{_PYTHON_TAG} must be followed by JSON call objects", text[:2000])

    def _read(self, text: str, found: Collector) -> None:
        tag = text.find(_PYTHON_TAG)
        while tag != -1:
            found.cut(tag, tag + len(_PYTHON_TAG))
            tag = text.find(_PYTHON_TAG, tag + 1)
        previous_end = -1
        match = _CALL_START.search(text)
        while match is not None:
            pos = match.start()
            try:
                value, end = raw_decode(text, pos)
            except ArgumentsError as error:
                found.arguments_error(error, text[pos : pos + 2000])
                if error.truncated or isinstance(error, NestingError):
                    return  # nothing complete can follow
                match = _CALL_START.search(text, pos + 1)
                continue
            if _is_call(value):
                try:
                    name, args, call_id = call_from_object(value)
                except ArgumentsError as error:
                    found.arguments_error(error, text[pos:end])
                else:
                    found.call(name, args, id=call_id, raw=text[pos:end])
                    if previous_end != -1 and not text[previous_end:pos].strip(_SEPARATORS):
                        found.cut(previous_end, pos)
                    found.cut(pos, end)
                    previous_end = end
            match = _CALL_START.search(text, end)

    def render(self, calls: Sequence[ToolCall], text: str = "") -> str:
        out = "; ".join(dumps(_object(call, "parameters")) for call in calls)
        return after_text(text, out)


# --- mistral ----------------------------------------------------------------------

_MISTRAL_MARK = "[TOOL_CALLS]"
_MISTRAL_NAMED = re.compile(
    r"\s*([A-Za-z_][A-Za-z0-9_\-.]*)\s*(?:\[CALL_ID\]\s*([A-Za-z0-9_\-]+)\s*)?(?:\[ARGS\])?"
)


def _blank_end(text: str, pos: int, limit: int) -> int:
    while pos < limit and text[pos] in " \t\r\n":
        pos += 1
    return pos


_FENCE_END = re.compile(r"\s*```")


def _read_array_after_junk(
    text: str, marker: int, pos: int, limit: int, found: Collector
) -> int | None:
    """``[TOOL_CALLS] junk [{...}]``: the pre-v11 array after stray text (a ```json
    fence, a phrase), whose words are never taken for a tool name."""
    raw = text[marker : min(limit, marker + 2000)]
    array = _ARRAY_OF_OBJECTS.search(text, pos, limit)
    if array is None:
        junk = text[pos : min(limit, pos + 40)].strip()
        found.error(
            "after [TOOL_CALLS] write TOOL_NAME{json arguments} (or a JSON array of call "
            f"objects); found {junk!r}",
            raw,
        )
        return None
    try:
        value, end = raw_decode(text, array.start())
        calls = [call_from_object(item) for item in value]
    except ArgumentsError as error:
        found.arguments_error(error, raw)
        return None
    fence = _FENCE_END.match(text, end, limit)
    if fence is not None and "```" in text[pos : array.start()]:
        end = fence.end()  # the closing fence of a ```json block
    source = text[marker:end]
    for name, args, call_id in calls:
        found.call(name, args, id=call_id, raw=source)
    return end


def _read_mistral(text: str, marker: int, pos: int, limit: int, found: Collector) -> int | None:
    """Calls after one ``[TOOL_CALLS]`` (either generation); the end of the syntax."""
    raw = text[marker:limit]
    stripped = text[pos:limit].lstrip()
    try:
        if stripped[:1] in ("[", "{"):
            value, end = raw_decode(text, pos)
            items = value if isinstance(value, list) else [value]
            calls = [call_from_object(item) for item in items]
        else:
            named = _MISTRAL_NAMED.match(text, pos, limit)
            after = _blank_end(text, named.end() if named else pos, limit)
            arguments_next = (
                after >= limit
                or text[after] == "{"
                or (text[after] == "[" and _ARRAY_OF_OBJECTS.match(text, after) is None)
            )  # NAME{...}, or NAME[...] that is no array of calls (reported below)
            if named is None or not named.group(1) or not arguments_next:
                # Junk before a pre-v11 array, or no call at all.
                return _read_array_after_junk(text, marker, pos, limit, found)
            try:
                value, end = raw_decode(text, named.end())
            except ArgumentsError as error:
                if error.truncated:
                    raise
                raise ArgumentsError(
                    f"after the tool name {named.group(1)!r} write its JSON arguments: "
                    f"{error.message}"
                ) from None
            if not isinstance(value, dict):
                raise ArgumentsError(
                    f"arguments of {named.group(1)!r} must be a JSON object, got {describe(value)}"
                )
            calls = [(named.group(1), value, named.group(2) or "")]
    except ArgumentsError as error:
        found.arguments_error(error, raw)
        return None
    source = text[marker:end]  # one object for all: hashed once for the ids
    for name, args, call_id in calls:
        found.call(name, args, id=call_id, raw=source)
    return end


class MistralParser(SyntaxParser):
    """``[TOOL_CALLS]`` in both Mistral generations.

    pre-v11 (Mistral-7B-Instruct-v0.3): ``[TOOL_CALLS] [{"name", "arguments"}, ...]``;
    stray text between the token and the array (a ```json fence, a phrase) is
    skipped, never read as a tool name; with no array, it is a parse error.
    v11+ (Mistral Small 3.x, Magistral, Devstral): ``[TOOL_CALLS]NAME{json}`` per call,
    optionally ``NAME[ARGS]{json}`` or ``NAME[CALL_ID]ID[ARGS]{json}`` (the id is kept).
    Both forms are parsed; ``variant`` chooses what :meth:`render` writes.
    """

    name = "mistral"
    syntax = '[TOOL_CALLS]TOOL_NAME{"arg": "value"}'

    def near_miss_markers(self) -> tuple[str, ...]:
        return (_MISTRAL_MARK,)

    def __init__(
        self,
        *,
        variant: Literal["v11", "pre_v11"] = "v11",
        tools: Any = None,
        max_chars: int | None = DEFAULT_MAX_CHARS,
    ) -> None:
        super().__init__(tools=tools, max_chars=max_chars)
        if variant not in ("v11", "pre_v11"):
            raise UserError(f"unknown mistral variant {variant!r}; valid: 'v11', 'pre_v11'")
        self.variant = variant

    def _scan(self, text: str, found: Collector) -> None:
        marker = text.find(_MISTRAL_MARK)
        while marker != -1:
            pos = marker + len(_MISTRAL_MARK)
            following = text.find(_MISTRAL_MARK, pos)
            limit = len(text) if following == -1 else following
            end = _read_mistral(text, marker, pos, limit, found)
            if end is not None:
                found.cut(marker, end)
            marker = following

    def render(self, calls: Sequence[ToolCall], text: str = "") -> str:
        if self.variant == "pre_v11":
            out = f"{_MISTRAL_MARK} {dumps([_object(c, 'arguments') for c in calls])}"
        else:
            out = "".join(f"{_MISTRAL_MARK}{c.tool}{dumps(c.args)}" for c in calls)
        return f"{text}{out}" if not text else f"{text}\n{out}"

    def __repr__(self) -> str:
        return f"MistralParser(variant={self.variant!r})"


# --- xlam -------------------------------------------------------------------------

_JSON_FENCE_OPEN = re.compile(r"```(?:json)?[ \t]*\n")


def _json_fences(text: str) -> list[tuple[int, int, int, int]]:
    """``(start, body start, body end, end)`` of each closed ```json fence, in one pass."""
    fences: list[tuple[int, int, int, int]] = []
    pos = 0
    while (opening := _JSON_FENCE_OPEN.search(text, pos)) is not None:
        close = text.find("```", opening.end())
        if close == -1:
            break
        fences.append((opening.start(), opening.end(), close, close + 3))
        pos = close + 3
    return fences


_ARRAY_OF_OBJECTS = re.compile(r"\[\s*\{")


class XLAMParser(SyntaxParser):
    """Salesforce xLAM-2: a JSON array of calls, bare, in a ```json fence,
    after ``[TOOL_CALLS]`` or inside ``<tool_call>...</tool_call>``."""

    name = "xlam"
    syntax = '[{"name": "TOOL_NAME", "arguments": {"arg": "value"}}]'

    def near_miss_markers(self) -> tuple[str, ...]:
        return ("<tool_call>", "</tool_call>", _MISTRAL_MARK)

    def _scan(self, text: str, found: Collector) -> None:
        if "<tool_call>" in text:
            scan_tagged(text, found, "<tool_call>", "</tool_call>")
            return
        fences = _json_fences(text)
        if fences:
            for start, body_start, body_end, end in fences:
                raw = text[start:end]
                try:
                    calls = read_calls(text[body_start:body_end])
                except ArgumentsError as error:
                    found.arguments_error(error, raw)
                    continue
                for name, args, call_id in calls:
                    found.call(name, args, id=call_id, raw=raw)
                found.cut(start, end)
            return
        marker = text.find(_MISTRAL_MARK)
        if marker != -1:
            stop = _read_mistral(text, marker, marker + len(_MISTRAL_MARK), len(text), found)
            if stop is not None:
                found.cut(marker, stop)
            return
        self._bare(text, found)

    def _bare(self, text: str, found: Collector) -> None:
        for match in _ARRAY_OF_OBJECTS.finditer(text):
            try:
                value, end = raw_decode(text, match.start())
            except ArgumentsError as error:
                # A broken array is reported when it is the whole answer (xLAM's
                # way) or cut off; scanning stops either way (bounded work).
                if error.truncated or not text[: match.start()].strip():
                    found.arguments_error(error, text[match.start() : match.start() + 2000])
                return
            try:
                calls = [call_from_object(item) for item in value]
            except ArgumentsError as error:
                found.arguments_error(error, text[match.start() : end])
                return
            raw = text[match.start() : end]  # one object for all: hashed once for the ids
            for name, args, call_id in calls:
                found.call(name, args, id=call_id, raw=raw)
            found.cut(match.start(), end)
            return

    def render(self, calls: Sequence[ToolCall], text: str = "") -> str:
        out = dumps([_object(c, "arguments") for c in calls])
        return after_text(text, out)
