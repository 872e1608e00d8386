"""Families built from special tokens around JSON arguments.

DeepSeek's tokens use the fullwidth bar ``｜`` (U+FF5C) and ``▁`` (U+2581);
Kimi's and Harmony's use ASCII ``<|...|>``. They are matched exactly.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from toolservices.parsing._common import (
    Block,
    Collector,
    ErrorFlood,
    SyntaxParser,
    after_text,
    iter_blocks,
)
from toolservices.parsing._json import ArgumentsError, arguments_from_text, dumps, scan_once
from toolservices.parsing.base import ParseResult, ToolCall

__all__ = ["DeepSeekV31Parser", "DeepSeekV3Parser", "HarmonyParser", "KimiK2Parser"]

_DS_CALLS_BEGIN = "<｜tool▁calls▁begin｜>"
_DS_CALLS_END = "<｜tool▁calls▁end｜>"
_DS_CALL_BEGIN = "<｜tool▁call▁begin｜>"
_DS_CALL_END = "<｜tool▁call▁end｜>"
_DS_SEP = "<｜tool▁sep｜>"
_FENCE = re.compile(r"^```(?:json)?\s*\n?(.*?)\n?```\s*$", re.DOTALL)
#: The head of one well-formed V3 call exactly as DeepSeek-V3 writes it (and
#: as ``render`` does); its arguments run to the first ``_DS_V3_TAIL``. A
#: section made only of such calls (or of ``_DS_V31_HEAD`` ones) is read
#: without the general scan; anything else (bad JSON, arguments that are not
#: an object, text between calls) takes the general path.
_DS_V3_HEAD = re.compile(f"{_DS_CALL_BEGIN}function{_DS_SEP}([^\\s{{<][^\\n<]*)\n```json\n")
_DS_V3_TAIL = f"\n```{_DS_CALL_END}"
#: The head of one V3.1 call, ``NAME<sep>`` with the JSON object right after it.
_DS_V31_HEAD = re.compile(f"{_DS_CALL_BEGIN}([^<]*){_DS_SEP}(?={{)")
_BLANKS = " \t\r\n"


def _section_calls(
    text: str, block: Block, call_begin: str, call_end: str
) -> tuple[list[tuple[str, str]], bool]:
    """The ``(call body, raw)`` pairs of one section, and whether all were closed."""
    pieces: list[tuple[str, str]] = []
    complete = True
    for inner in iter_blocks(
        text, call_begin, call_end, start=block.body_start, end=block.body_end
    ):
        pieces.append((inner.body(text), text[inner.start : inner.end]))
        complete = complete and inner.closed
    return pieces, complete


class DeepSeekV3Parser(SyntaxParser):
    """DeepSeek-V3 / R1: ``function<｜tool▁sep｜>NAME`` + a ```json fence per call.

    Also reads the V3.1 layout (``NAME<｜tool▁sep｜>{json}``), so one parser
    serves checkpoints of either generation; :meth:`render` writes V3.
    """

    name = "deepseek_v3"
    syntax = (
        f"{_DS_CALLS_BEGIN}{_DS_CALL_BEGIN}function{_DS_SEP}TOOL_NAME\n```json\n"
        f'{{"arg": "value"}}\n```{_DS_CALL_END}{_DS_CALLS_END}'
    )

    def near_miss_markers(self) -> tuple[str, ...]:
        return (_DS_CALLS_BEGIN, _DS_CALL_BEGIN, _DS_SEP, _DS_CALLS_END)

    def _scan(self, text: str, found: Collector) -> None:
        for block in iter_blocks(text, _DS_CALLS_BEGIN, _DS_CALLS_END):
            if _fast_section(text, block, found):
                continue
            raw = text[block.start : block.end]
            pieces, complete = _section_calls(text, block, _DS_CALL_BEGIN, _DS_CALL_END)
            if not complete or (not pieces and not block.closed):
                found.error("the tool calls are cut off (truncated?)", raw, kind="truncated")
                continue
            if not pieces:
                found.error(f"no {_DS_CALL_BEGIN}...{_DS_CALL_END} call inside the block", raw)
                continue
            try:
                calls = [self._call(body) for body, _ in pieces]
            except ArgumentsError as error:
                found.arguments_error(error, raw)
                continue
            for (name, args), (_, piece) in zip(calls, pieces, strict=True):
                found.call(name, args, raw=piece)
            found.cut(block.start, block.end)

    @staticmethod
    def _call(body: str) -> tuple[str, dict[str, Any]]:
        head, sep, rest = body.partition(_DS_SEP)
        if not sep:
            raise ArgumentsError(
                f"each call needs {_DS_SEP} between the name and the arguments",
                kind="invalid_syntax",
            )
        head = head.strip()
        if head == "function" and not rest.lstrip().startswith("{"):
            # V3: function<sep>NAME\n```json\n{...}\n```
            name, _, payload = rest.partition("\n")
            fence = _FENCE.match(payload.strip())
            payload = fence.group(1) if fence else payload
        else:
            # V3.1: NAME<sep>{...}
            name, payload = head, rest
        name = name.strip()
        if not name:
            raise ArgumentsError("the tool name is missing", kind="invalid_syntax")
        try:
            return name, arguments_from_text(payload)
        except ArgumentsError as error:
            raise ArgumentsError(
                f"tool {name!r}: {error.message}", truncated=error.truncated
            ) from None

    def render(self, calls: Sequence[ToolCall], text: str = "") -> str:
        parts = "".join(
            f"{_DS_CALL_BEGIN}function{_DS_SEP}{c.tool}\n```json\n{dumps(c.args)}\n```{_DS_CALL_END}"
            for c in calls
        )
        return after_text(text, f"{_DS_CALLS_BEGIN}{parts}{_DS_CALLS_END}")


def _fast_section(text: str, block: Block, found: Collector) -> bool:
    """Read a section of well-formed V3 or V3.1 calls whose arguments are JSON objects.

    Gives the same calls as the general path, which also ignores what lies
    between the calls and accepts a section whose end token never came when
    its calls are complete. DeepSeek-V3 writes a newline between calls: blanks
    there are skipped. Returns False (recording nothing) for any section it
    does not fully recognise.
    """
    calls = []
    pos, stop = block.body_start, block.body_end
    while True:
        while pos < stop and text[pos] in _BLANKS:
            pos += 1
        if pos >= stop:
            break
        head = _DS_V3_HEAD.match(text, pos, stop)
        tail = _DS_V3_TAIL  # V3: the object fills the fence up to its tail
        if head is None:
            head = _DS_V31_HEAD.match(text, pos, stop)
            tail = _DS_CALL_END  # V3.1: the object runs up to the call's end token
            if head is None:
                return False
        name = head.group(1).strip()
        # The object is read in place (no copy of its text) and must end right
        # at the tail, with no end token inside it: then the tail after it is
        # the first one, where the general scan cuts the call. Blanks around
        # it go to the general path. Decoding first stops a truncated call at
        # its end instead of searching the rest of the text for a tail.
        args_start = head.end()
        try:
            args, close = scan_once(text, args_start)
        except (StopIteration, ValueError, RecursionError):
            return False
        if (
            type(args) is not dict
            or not name
            or not text.startswith(tail, close, stop)
            or text.find(_DS_CALL_END, args_start, close) != -1
        ):
            return False
        pos = close + len(tail)
        calls.append((name, args, text[head.start() : pos]))
    if not calls:
        return False
    for name, args, piece in calls:
        found.call(name, args, raw=piece)
    found.cut(block.start, block.end)
    return True


class DeepSeekV31Parser(DeepSeekV3Parser):
    """DeepSeek-V3.1: ``NAME<｜tool▁sep｜>{json}`` (no type, no fence); reads V3 too."""

    name = "deepseek_v31"
    syntax = (
        f'{_DS_CALLS_BEGIN}{_DS_CALL_BEGIN}TOOL_NAME{_DS_SEP}{{"arg": "value"}}'
        f"{_DS_CALL_END}{_DS_CALLS_END}"
    )

    def render(self, calls: Sequence[ToolCall], text: str = "") -> str:
        parts = "".join(
            f"{_DS_CALL_BEGIN}{c.tool}{_DS_SEP}{dumps(c.args)}{_DS_CALL_END}" for c in calls
        )
        return after_text(text, f"{_DS_CALLS_BEGIN}{parts}{_DS_CALLS_END}")


_KIMI_SECTION = re.compile(r"<\|tool_calls?_section_begin\|>")
_KIMI_SECTION_END = re.compile(r"<\|tool_calls?_section_end\|>")
_KIMI_CALL = re.compile(
    r"<\|tool_call_begin\|>\s*([^<]+?)\s*<\|tool_call_argument_begin\|>(.*?)(<\|tool_call_end\|>|$)",
    re.DOTALL,
)
_KIMI_ID = re.compile(r"^(?:functions\.)?(.+?)(?::\d+)?$")


class KimiK2Parser(SyntaxParser):
    """Kimi K2: ``<|tool_call_begin|>functions.NAME:IDX<|tool_call_argument_begin|>{json}``.

    The call id (``functions.NAME:IDX``) is the model's own and is kept.
    """

    name = "kimi_k2"
    syntax = (
        "<|tool_calls_section_begin|><|tool_call_begin|>functions.TOOL_NAME:0"
        '<|tool_call_argument_begin|>{"arg": "value"}<|tool_call_end|><|tool_calls_section_end|>'
    )

    def near_miss_markers(self) -> tuple[str, ...]:
        return (
            "<|tool_calls_section_begin|>",
            "<|tool_call_section_begin|>",
            "<|tool_call_begin|>",
        )

    def _scan(self, text: str, found: Collector) -> None:
        pos = 0
        while (begin := _KIMI_SECTION.search(text, pos)) is not None:
            end_match = _KIMI_SECTION_END.search(text, begin.end())
            body_end = len(text) if end_match is None else end_match.start()
            end = len(text) if end_match is None else end_match.end()
            raw = text[begin.start() : end]
            calls = list(_KIMI_CALL.finditer(text, begin.end(), body_end))
            try:
                if not calls:
                    raise ArgumentsError(
                        "no <|tool_call_begin|>...<|tool_call_end|> call inside the section"
                        + (" (truncated?)" if end_match is None else ""),
                        truncated=end_match is None,
                        kind="invalid_syntax",
                    )
                parsed = [self._call(match) for match in calls]
            except ArgumentsError as error:
                found.arguments_error(error, raw)
                pos = end
                continue
            for (name, args, call_id), match in zip(parsed, calls, strict=True):
                found.call(name, args, id=call_id, raw=match.group(0))
            found.cut(begin.start(), end)
            pos = end

    @staticmethod
    def _call(match: re.Match[str]) -> tuple[str, dict[str, Any], str]:
        call_id = match.group(1).strip()
        if not match.group(3):
            raise ArgumentsError(f"call {call_id!r} is never closed (truncated?)", truncated=True)
        id_match = _KIMI_ID.match(call_id)
        name = id_match.group(1) if id_match else call_id
        try:
            return name, arguments_from_text(match.group(2)), call_id
        except ArgumentsError as error:
            raise ArgumentsError(
                f"tool {name!r}: {error.message}", truncated=error.truncated
            ) from None

    def render(self, calls: Sequence[ToolCall], text: str = "") -> str:
        parts = []
        for index, call in enumerate(calls):
            call_id = call.id if call.id.startswith(f"functions.{call.tool}:") else ""
            call_id = call_id or f"functions.{call.tool}:{index}"
            parts.append(
                f"<|tool_call_begin|>{call_id}<|tool_call_argument_begin|>{dumps(call.args)}"
                "<|tool_call_end|>"
            )
        return after_text(
            text, f"<|tool_calls_section_begin|>{''.join(parts)}<|tool_calls_section_end|>"
        )


_HARMONY_ENDS = re.compile(r"<\|(?:end|call|return|start)\|>")
_HARMONY_TO = re.compile(r"to=(?:functions\.)?([^\s<]+)")
_HARMONY_CHANNEL = re.compile(r"(?:<\|channel\|>)?\s*(analysis|commentary|final)\b")


class HarmonyParser(SyntaxParser):
    """gpt-oss (Harmony), read from the decoded text (special tokens kept).

    A message addressed ``to=functions.NAME`` is a call with a JSON body. The
    visible text is the ``final`` and plain ``commentary`` messages;
    ``analysis`` (reasoning) goes to ``meta["reasoning"]``. Text without
    Harmony tokens is plain text.
    """

    name = "openai"
    syntax = (
        "<|start|>assistant<|channel|>commentary to=functions.TOOL_NAME <|constrain|>json"
        '<|message|>{"arg": "value"}<|call|>'
    )

    def near_miss_markers(self) -> tuple[str, ...]:
        return ("to=functions.",)  # checked in _parse: a call header with no message

    def _parse(self, text: str) -> ParseResult:
        found = Collector(self, text)
        if "<|message|>" not in text:
            result = found.result()
            if "to=functions." in text:  # a call header without its message
                found.error("a call addressed to=functions.NAME needs <|message|>{json}<|call|>")
                result.errors = found.errors
            return result
        visible: list[str] = []
        reasoning: list[str] = []
        boundary = 0
        marker = text.find("<|message|>")
        while marker != -1:
            header = text[boundary:marker]
            body_start = marker + len("<|message|>")
            ending = _HARMONY_ENDS.search(text, body_start)
            body_end = len(text) if ending is None else ending.start()
            body = text[body_start:body_end]
            raw = text[boundary : body_end if ending is None else ending.end()]
            target = _HARMONY_TO.search(header)
            channel = _HARMONY_CHANNEL.search(header.replace("<|start|>assistant", ""))
            if target is not None:
                try:
                    self._call(target.group(1), body, raw, ending, found)
                except ErrorFlood:
                    break  # the last error says the scan stopped
            elif channel is not None and channel.group(1) == "analysis":
                reasoning.append(body.strip())
            else:
                visible.append(body.strip())
            if ending is None:
                break
            boundary = ending.end() if ending.group(0) != "<|start|>" else ending.start()
            marker = text.find("<|message|>", body_end)
        result = found.result()
        result.text = "\n".join(part for part in visible if part)
        if reasoning:
            result.meta["reasoning"] = "\n".join(reasoning)
        return result

    @staticmethod
    def _call(
        name: str, body: str, raw: str, ending: re.Match[str] | None, found: Collector
    ) -> None:
        if ending is None or ending.group(0) == "<|start|>":
            found.error(
                f"the call of {name!r} is cut off before <|call|> (truncated?)",
                raw,
                kind="truncated",
                tool=name,
            )
            return
        try:
            args = arguments_from_text(body)
        except ArgumentsError as error:
            found.arguments_error(error, raw, tool=name)
            return
        found.call(name, args, raw=raw)

    def render(self, calls: Sequence[ToolCall], text: str = "") -> str:
        parts = [f"<|channel|>final<|message|>{text}<|end|>"] if text else []
        parts += [
            f"<|start|>assistant<|channel|>commentary to=functions.{c.tool} <|constrain|>json"
            f"<|message|>{dumps(c.args)}<|call|>"
            for c in calls
        ]
        return "".join(parts)
