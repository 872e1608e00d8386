"""Families of the 2026 model generations: Gemma 4, DeepSeek-V4, Liquid LFM2/LFM2.5.

* ``gemma4``: ``<|tool_call>call:NAME{key:VALUE,...}<tool_call|>``, one block
  per call, back to back. Strings are delimited by the ``<|"|>`` token; keys,
  numbers, booleans and ``null`` are bare; objects ``{k:v}`` and lists
  ``[a,b]`` nest. Values carry their own type, so no schema is needed.
* ``deepseek_v4``: the DeepSeek-V3.2 DSML grammar inside ``<｜DSML｜tool_calls>``
  (``string="true|false"`` per parameter); an invoke body may instead be one
  JSON object of arguments.
* ``lfm2``: ``<|tool_call_start|>[f(a='x'), g(n=1)]<|tool_call_end|>``, a
  Python list of keyword calls read as literals (nothing is evaluated), or a
  JSON array of ``{"name", "arguments"}`` when the model was asked for JSON.

Nemotron 3 and Qwen3.5/3.6 write the Qwen3-Coder XML format: they are aliases
of ``qwen3_coder`` in the registry, not families of their own.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from toolservices.parsing._common import (
    Collector,
    SyntaxParser,
    after_text,
    iter_blocks,
    segments,
    xml_params,
)
from toolservices.parsing._json import ArgumentsError, arguments_from_text, dumps
from toolservices.parsing.base import ToolCall
from toolservices.parsing.json_families import read_calls
from toolservices.parsing.pythonic import list_calls, python_literal
from toolservices.parsing.xml_families import DeepSeekV32Parser

__all__ = ["DeepSeekV4Parser", "Gemma4Parser", "Lfm2Parser"]


# --- gemma4 ---------------------------------------------------------------------------

_G4_START = "<|tool_call>"
_G4_END = "<tool_call|>"
_G4_STR = '<|"|>'
#: Nesting the reader follows before it gives up (hostile output, not a real call).
_G4_MAX_DEPTH = 100
_G4_KEY = re.compile(r"[^:{}\[\],]*")
_G4_BARE = re.compile(r"[^,}\]]*")
_NUMBER = re.compile(r"-?(?:0|[1-9]\d*)(?:\.\d+)?(?:[eE][+-]?\d+)?")
_BARE_CONSTANTS: dict[str, Any] = {"true": True, "false": False, "null": None, "None": None}


class _Gemma4Reader:
    """Reads Gemma 4 values left to right; each character is looked at once."""

    def __init__(self, text: str, pos: int) -> None:
        self.text = text
        self.pos = pos

    def _skip(self, chars: str) -> None:
        text, pos = self.text, self.pos
        while pos < len(text) and text[pos] in chars:
            pos += 1
        self.pos = pos

    def _at_end(self, what: str) -> None:
        if self.pos >= len(self.text):
            raise ArgumentsError(f"{what} is never closed (truncated?)", truncated=True)

    def _string(self) -> str:
        start = self.pos + len(_G4_STR)
        end = self.text.find(_G4_STR, start)
        if end == -1:
            raise ArgumentsError(
                f"a string opened with {_G4_STR} is never closed (truncated?)", truncated=True
            )
        self.pos = end + len(_G4_STR)
        return self.text[start:end]

    def value(self, depth: int) -> Any:
        self._skip(" \t\r\n")
        self._at_end("a value")
        text = self.text
        if text.startswith(_G4_STR, self.pos):
            return self._string()
        if text[self.pos] == "{":
            return self.object(depth + 1)
        if text[self.pos] == "[":
            return self._list(depth + 1)
        match = _G4_BARE.match(text, self.pos)
        assert match is not None  # the pattern matches the empty string
        self.pos = match.end()
        token = match.group(0).strip()
        if not token:
            raise ArgumentsError("a value is missing (write key:value)", kind="invalid_syntax")
        if token in _BARE_CONSTANTS:
            return _BARE_CONSTANTS[token]
        if _NUMBER.fullmatch(token):
            return float(token) if any(c in token for c in ".eE") else int(token)
        return token  # a bare word: kept as text, as Gemma's own parsers do

    def _list(self, depth: int) -> list[Any]:
        if depth > _G4_MAX_DEPTH:
            raise ArgumentsError("the arguments are nested too deeply")
        self.pos += 1  # "["
        items: list[Any] = []
        while True:
            self._skip(" \t\r\n,")
            self._at_end("a list opened with '['")
            if self.text[self.pos] == "]":
                self.pos += 1
                return items
            items.append(self.value(depth))

    def object(self, depth: int) -> dict[str, Any]:
        if depth > _G4_MAX_DEPTH:
            raise ArgumentsError("the arguments are nested too deeply")
        self.pos += 1  # "{"
        result: dict[str, Any] = {}
        while True:
            self._skip(" \t\r\n,")
            self._at_end("an object opened with '{'")
            if self.text[self.pos] == "}":
                self.pos += 1
                return result
            if self.text.startswith(_G4_STR, self.pos):
                key = self._string()
            else:
                match = _G4_KEY.match(self.text, self.pos)
                assert match is not None
                self.pos = match.end()
                key = match.group(0).strip()
            self._at_end("an object opened with '{'")
            if self.text[self.pos] != ":" or not key:
                raise ArgumentsError(
                    "each argument must be written key:value", kind="invalid_syntax"
                )
            self.pos += 1
            result[key] = self.value(depth)


def _gemma4_value(value: Any) -> str:
    if isinstance(value, str):
        return f"{_G4_STR}{value}{_G4_STR}"
    if isinstance(value, dict):
        return "{" + ",".join(f"{k}:{_gemma4_value(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list | tuple):
        return "[" + ",".join(_gemma4_value(v) for v in value) + "]"
    return dumps(value)


class Gemma4Parser(SyntaxParser):
    """Gemma 4: ``<|tool_call>call:NAME{city:<|"|>Paris<|"|>,days:3}<tool_call|>``.

    A call whose arguments are complete but whose ``<tool_call|>`` never came
    (the generation stopped right after ``}``) is accepted; one cut off inside
    the arguments is reported as truncated.
    """

    name = "gemma4"
    syntax = f"{_G4_START}call:TOOL_NAME{{city:{_G4_STR}Paris{_G4_STR},days:3}}{_G4_END}"

    def _scan(self, text: str, found: Collector) -> None:
        for block in iter_blocks(text, _G4_START, _G4_END):
            raw = text[block.start : block.end]
            body = block.body(text)
            head = body.lstrip()
            brace = head.find("{")
            if not head.startswith("call:") or brace == -1:
                what = "write call:TOOL_NAME{arg:value} inside the block"
                truncated = not block.closed
                if truncated:
                    what = f"the call is cut off (truncated?); {what}"
                found.error(what, raw, kind="truncated" if truncated else "invalid_syntax")
                continue
            name = head[5:brace].strip()
            if not name or any(c.isspace() for c in name):
                found.error(f"{name!r} is not a tool name: write call:TOOL_NAME{{...}}", raw)
                continue
            reader = _Gemma4Reader(head, brace)
            try:
                args = reader.object(1)
            except ArgumentsError as error:
                if error.truncated and block.closed:  # a bracket or delimiter is missing
                    error = ArgumentsError(
                        error.message.replace(" (truncated?)", f" before {_G4_END}"),
                        kind="invalid_syntax",
                    )
                found.arguments_error(error, raw, tool=name)
                continue
            if head[reader.pos :].strip():
                found.error(
                    f"unexpected text after the arguments of {name!r}: close the call with "
                    f"}}{_G4_END}",
                    raw,
                    tool=name,
                )
                continue
            found.call(name, args, raw=raw)
            found.cut(block.start, block.end)

    def render(self, calls: Sequence[ToolCall], text: str = "") -> str:
        out = "".join(
            f"{_G4_START}call:{call.tool}{_gemma4_value(call.args)}{_G4_END}" for call in calls
        )
        return after_text(text, out)


# --- deepseek_v4 ----------------------------------------------------------------------

_DSML = "｜DSML｜"


class DeepSeekV4Parser(DeepSeekV32Parser):
    """DeepSeek-V4: V3.2's DSML invokes inside ``<｜DSML｜tool_calls>``.

    An invoke holds ``<｜DSML｜parameter name="K" string="true|false">`` elements
    (``"false"`` values are JSON) or one JSON object of arguments.
    """

    name = "deepseek_v4"
    open_tag = f"<{_DSML}tool_calls>"
    close_tag = f"</{_DSML}tool_calls>"
    syntax = (
        f'<{_DSML}tool_calls>\n<{_DSML}invoke name="TOOL_NAME">\n'
        f'<{_DSML}parameter name="ARG" string="true">text</{_DSML}parameter>\n'
        f'<{_DSML}parameter name="N" string="false">5</{_DSML}parameter>\n'
        f"</{_DSML}invoke>\n</{_DSML}tool_calls>"
    )

    def _arguments(self, tool: str, inner: str) -> dict[str, Any]:
        stripped = inner.strip()
        if stripped.startswith("{"):
            try:
                return arguments_from_text(stripped)
            except ArgumentsError as error:
                # The invoke is closed: a missing bracket is bad JSON, not a cut-off.
                kind = "invalid_json" if error.truncated else error.kind
                raise ArgumentsError(f"tool {tool!r}: {error.message}", kind=kind) from None
        pairs = xml_params(inner, self.param_re, self.param_close, stops=(self.section_close,))
        if not pairs and stripped:
            raise ArgumentsError(
                f"tool {tool!r}: write its arguments as <{_DSML}parameter> elements "
                "or as one JSON object",
                kind="invalid_syntax",
            )
        return {match.group(1).strip(): self._value(tool, match, value) for match, value in pairs}

    def _scan(self, text: str, found: Collector) -> None:
        for block in iter_blocks(text, self.open_tag, self.close_tag):
            raw = text[block.start : block.end]
            sections: list[tuple[str, str, bool]] = []
            for match, inner in segments(block.body(text), self.section_re):
                end = inner.find(self.section_close)
                sections.append(
                    (match.group(1).strip(), inner[:end] if end != -1 else inner, end != -1)
                )
            if not sections or (not block.closed and not sections[-1][2]):
                truncated = not block.closed
                what = f"inside {self.open_tag} write {self.inner_hint}"
                if truncated:
                    what = f"the call is cut off before {self.section_close} (truncated?)"
                tool = sections[-1][0] if sections else None
                found.error(
                    what,
                    raw,
                    kind="truncated" if truncated else "invalid_syntax",
                    tool=tool or None,
                )
                continue
            if any(not name for name, _, _ in sections):
                found.error(f"a tool name is missing: write {self.inner_hint}", raw)
                continue
            try:
                calls = [(name, self._arguments(name, inner)) for name, inner, _ in sections]
            except ArgumentsError as error:
                found.arguments_error(error, raw)
                continue
            for name, args in calls:
                found.call(name, args, raw=raw)
            found.cut(block.start, block.end)


# --- lfm2 -----------------------------------------------------------------------------

_LFM_START = "<|tool_call_start|>"
_LFM_END = "<|tool_call_end|>"


def _lfm2_calls(body: str) -> list[tuple[str, dict[str, Any]]]:
    """The calls of one block: a JSON array of call objects, or a Python list of calls."""
    stripped = body.strip()
    if not stripped:
        raise ArgumentsError("the block is empty: write a list of calls", kind="invalid_syntax")
    if stripped.startswith("{") or (
        stripped.startswith("[") and stripped[1:].lstrip().startswith("{")
    ):
        return [(name, args) for name, args, _ in read_calls(stripped)]
    calls = list_calls(stripped)
    if not calls:
        raise ArgumentsError("the list of calls is empty", kind="invalid_syntax")
    return calls


class Lfm2Parser(SyntaxParser):
    """Liquid LFM2 / LFM2.5: ``<|tool_call_start|>[f(a='x')]<|tool_call_end|>``.

    The list is Python literals only (JSON's ``true``/``false``/``null`` too);
    a JSON array of ``{"name", "arguments"}`` objects is read as well. A
    complete list whose end token never came is accepted.
    """

    name = "lfm2"
    syntax = f"{_LFM_START}[tool_name(arg='value', n=1), other_tool()]{_LFM_END}"

    def _scan(self, text: str, found: Collector) -> None:
        for block in iter_blocks(text, _LFM_START, _LFM_END):
            raw = text[block.start : block.end]
            try:
                calls = _lfm2_calls(block.body(text))
            except ArgumentsError as error:
                if not block.closed:
                    error = ArgumentsError(
                        f"the call list is never closed with {_LFM_END} (truncated?): "
                        f"{error.message}",
                        truncated=True,
                    )
                found.arguments_error(error, raw)
                continue
            for name, args in calls:
                found.call(name, args, raw=raw)
            found.cut(block.start, block.end)

    def render(self, calls: Sequence[ToolCall], text: str = "") -> str:
        rendered = ", ".join(
            f"{call.tool}("
            + ", ".join(f"{k}={python_literal(v)}" for k, v in call.args.items())
            + ")"
            for call in calls
        )
        return after_text(text, f"{_LFM_START}[{rendered}]{_LFM_END}")
