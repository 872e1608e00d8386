"""The Gemma families: FunctionGemma and Gemma 4.

* ``functiongemma``: ``<start_function_call>call:NAME{k:<escape>v<escape>,...}<end_function_call>``;
  string values are delimited by ``<escape>``.
* ``gemma4``: ``<|tool_call>call:NAME{key:VALUE,...}<tool_call|>``, one block
  per call, back to back. Strings are delimited by the ``<|"|>`` token; keys,
  numbers, booleans and ``null`` are bare; objects ``{k:v}`` and lists
  ``[a,b]`` nest. Values carry their own type, so no schema is needed.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any

from toolservices.parsing._common import (
    Collector,
    SyntaxParser,
    after_text,
    iter_blocks,
)
from toolservices.parsing._json import ArgumentsError, dumps
from toolservices.parsing.base import ToolCall

__all__ = ["FunctionGemmaParser", "Gemma4Parser"]


# --- functiongemma ------------------------------------------------------------------

_ESC = "<escape>"
_FG_START = "<start_function_call>"
_FG_END = "<end_function_call>"


class _GemmaReader:
    """Recursive reader of FunctionGemma's ``{k:<escape>v<escape>,k2:5}`` values."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.pos = 0

    def _skip(self, chars: str = " \t\r\n") -> None:
        while self.pos < len(self.text) and self.text[self.pos] in chars:
            self.pos += 1

    def value(self) -> Any:
        self._skip()
        text = self.text
        if text.startswith(_ESC, self.pos):
            end = text.find(_ESC, self.pos + len(_ESC))
            if end == -1:
                raise ArgumentsError(
                    "a value opened with <escape> is never closed (truncated?)", truncated=True
                )
            value = text[self.pos + len(_ESC) : end]
            self.pos = end + len(_ESC)
            return value
        if text.startswith("{", self.pos):
            return self.obj()
        if text.startswith("[", self.pos):
            self.pos += 1
            items: list[Any] = []
            while True:
                self._skip(" \t\r\n,")
                if self.pos >= len(text):
                    raise ArgumentsError(
                        "a list is never closed with ']' (truncated?)", truncated=True
                    )
                if text[self.pos] == "]":
                    self.pos += 1
                    return items
                items.append(self.value())
        match = re.compile(r"[^,}\]]*").match(text, self.pos)
        assert match is not None
        self.pos = match.end()
        token = match.group(0).strip()
        try:
            return json.loads(token)
        except json.JSONDecodeError:
            return token

    def obj(self) -> dict[str, Any]:
        self.pos += 1  # the "{"
        result: dict[str, Any] = {}
        while True:
            self._skip(" \t\r\n,")
            if self.pos >= len(self.text):
                raise ArgumentsError(
                    "the arguments are never closed with '}' (truncated?)", truncated=True
                )
            if self.text[self.pos] == "}":
                self.pos += 1
                return result
            colon = self.text.find(":", self.pos)
            if colon == -1:
                raise ArgumentsError(
                    "each argument must be written key:value", kind="invalid_syntax"
                )
            key = self.text[self.pos : colon].strip()
            self.pos = colon + 1
            result[key] = self.value()


class FunctionGemmaParser(SyntaxParser):
    """FunctionGemma: ``<start_function_call>call:NAME{k:<escape>v<escape>}<end_function_call>``."""

    name = "functiongemma"
    syntax = f"{_FG_START}call:TOOL_NAME{{arg:{_ESC}text{_ESC},n:5}}{_FG_END}"

    def near_miss_markers(self) -> tuple[str, ...]:
        return (_FG_START, _FG_END)

    def _scan(self, text: str, found: Collector) -> None:
        for block in iter_blocks(text, _FG_START, _FG_END):
            raw = text[block.start : block.end]
            body = block.body(text).strip()
            brace = body.find("{")
            if not body.startswith("call:") or brace == -1:
                kind = "truncated" if not block.closed else "invalid_syntax"
                found.error("write call:TOOL_NAME{arg:<escape>value<escape>}", raw, kind=kind)
                continue
            name = body[5:brace].strip()
            reader = _GemmaReader(body[brace:])
            try:
                args = reader.obj()
            except ArgumentsError as error:
                found.arguments_error(error, raw, tool=name)
                continue
            if not block.closed:
                found.error(
                    f"the call is never closed with {_FG_END} (truncated?)",
                    raw,
                    kind="truncated",
                    tool=name,
                )
                continue
            found.call(name, args, raw=raw)
            found.cut(block.start, block.end)

    @staticmethod
    def _write(value: Any) -> str:
        if isinstance(value, str):
            return f"{_ESC}{value}{_ESC}"
        if isinstance(value, dict):
            return (
                "{"
                + ",".join(f"{k}:{FunctionGemmaParser._write(v)}" for k, v in value.items())
                + "}"
            )
        if isinstance(value, list):
            return "[" + ",".join(FunctionGemmaParser._write(v) for v in value) + "]"
        return dumps(value)

    def render(self, calls: Sequence[ToolCall], text: str = "") -> str:
        out = "".join(f"{_FG_START}call:{c.tool}{self._write(c.args)}{_FG_END}" for c in calls)
        return after_text(text, out)


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
