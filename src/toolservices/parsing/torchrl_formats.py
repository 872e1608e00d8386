"""The syntaxes TorchRL 0.14.1's tool transforms use.

* ``xml_block`` (:class:`XMLBlockParser`) and ``json_envelope``
  (:class:`JSONCallParser`): the contract parsers, same results as TorchRL's
  classes on everything TorchRL handles. Where TorchRL crashes (a JSON
  envelope whose ``tools`` is not a list of objects) or passes a non-object
  as ``args``, we report a :class:`ParseFailure` instead.
* ``python_block``: the fenced code blocks ``PythonInterpreter`` runs.
* ``simple_tool``: ``<tool>NAME\\n{json}</tool>`` of ``SimpleToolTransform`` and
  ``MCPToolTransform``; :class:`RegexParser` for their custom ``tool_call_pattern``.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

from toolservices.errors import UserError
from toolservices.parsing._common import (
    Collector,
    ErrorFlood,
    SyntaxParser,
    after_text,
    iter_blocks,
)
from toolservices.parsing._json import (
    ArgumentsError,
    arguments_from_text,
    decode_arguments,
    describe,
    dumps,
)
from toolservices.parsing.base import (
    DEFAULT_MAX_CHARS,
    ParseFailure,
    ParseResult,
    ToolCall,
    make_call_id,
)

__all__ = [
    "JSONCallParser",
    "PythonBlockParser",
    "RegexParser",
    "SimpleToolParser",
    "XMLBlockParser",
]


# --- xml_block ---------------------------------------------------------------------

# An opening tag with one or more double-quoted attributes, in any order.
_XML_OPEN = re.compile(r'<tool((?:\s+[A-Za-z_][\w.:-]*\s*=\s*"[^"]*")+)\s*>')
_XML_ATTR = re.compile(r'([A-Za-z_][\w.:-]*)\s*=\s*"([^"]*)"')
_XML_CLOSE = "</tool>"


class XMLBlockParser(SyntaxParser):
    """``<tool name="NAME" tag="TAG">{json}</tool>`` blocks anywhere in the text.

    As in TorchRL: a body that is not a JSON object gives ``{"raw": body}``
    (the body without surrounding blanks), an empty body gives ``{}`` (neither
    is a parse error: the tool decides). A superset of TorchRL's syntax:
    attributes may come in any order, with blanks around ``=``; an empty
    ``tag=""`` means no tag. A block whose ``</tool>`` never comes is
    reported as truncated; one without a ``name``, or with another attribute,
    as invalid syntax (TorchRL leaves those in the text silently).
    """

    name = "xml_block"
    syntax = '<tool name="TOOL_NAME" tag="OPTIONAL_TAG">{"arg": "value"}</tool>'

    def near_miss_markers(self) -> tuple[str, ...]:
        return ("<tool name", "</tool>")  # e.g. name='x' in single quotes

    def _scan(self, text: str, found: Collector) -> None:
        pos = 0
        while (opening := _XML_OPEN.search(text, pos)) is not None:
            attrs: dict[str, str] = {}
            for key, value in _XML_ATTR.findall(opening.group(1)):
                attrs.setdefault(key, value)
            name = attrs.get("name", "")
            unknown = sorted(set(attrs) - {"name", "tag"})
            close = text.find(_XML_CLOSE, opening.end())
            if close == -1:
                found.error(
                    "the <tool> block is never closed with </tool> (truncated?)",
                    text[opening.start() : opening.start() + 2000],
                    kind="truncated",
                    tool=name or None,
                )
                return
            end = close + len(_XML_CLOSE)
            pos = end
            if not name or unknown:
                what = 'the <tool> tag needs a non-empty name="TOOL_NAME" attribute'
                if unknown:
                    what = f"unknown <tool> attribute {unknown[0]!r} (only name and tag)"
                found.error(what, text[opening.start() : end], tool=name or None)
                continue
            body = text[opening.end() : close].strip()
            try:
                args = arguments_from_text(body)
            except ArgumentsError:
                args = {"raw": body}
            tag = attrs.get("tag") or None
            found.call(name, args, tag=tag, raw=text[opening.start() : end])
            found.cut(opening.start(), end)

    def render(self, calls: Sequence[ToolCall], text: str = "") -> str:
        blocks = []
        for call in calls:
            tag = f' tag="{call.tag}"' if call.tag else ""
            blocks.append(f'<tool name="{call.tool}"{tag}>{dumps(call.args)}</tool>')
        return after_text(text, "\n".join(blocks))


# --- json_envelope -----------------------------------------------------------------


class JSONCallParser(SyntaxParser):
    """The whole response is ``{"message": str, "tools": [{"tool", "args", "tag"?}]}``.

    Given as a JSON string or as the envelope dict itself. Text that is not a
    JSON object is plain text with no calls, returned unchanged (like TorchRL,
    the message is not stripped). A chat message dict without ``message`` /
    ``tools`` keys is read through its ``text`` / ``content``.
    """

    name = "json_envelope"
    syntax = (
        '{"message": "text for the user", "tools": [{"tool": "TOOL_NAME", "args": {"arg": 1}}]}'
    )

    def near_miss_markers(self) -> tuple[str, ...]:
        return ('"tools"',)  # checked in _parse, outside a whole-response envelope

    def __call__(self, response: str | Mapping[str, Any] | None) -> ParseResult:
        if isinstance(response, Mapping) and ("message" in response or "tools" in response):
            found = Collector(self, "")
            text = self._envelope(response, found, None)
            return self._finish(ParseResult(text, found.calls, found.errors))
        return super().__call__(response)

    def _parse(self, text: str) -> ParseResult:
        found = Collector(self, text)
        stripped = text.strip()
        if not stripped.startswith("{"):
            if '"tools"' in text:  # an envelope in prose or a fence: a near miss
                found.error(
                    'the response mentions "tools" but is not one JSON envelope: write the '
                    "whole response as the JSON object, with no text or fence around it",
                    text,
                )
            return ParseResult(text, [], found.errors)
        try:
            envelope = json.loads(stripped)
        except (json.JSONDecodeError, RecursionError) as error:
            if '"tools"' in stripped:
                what = "the JSON envelope is not valid JSON"
                if isinstance(error, json.JSONDecodeError):
                    what += f" ({error.msg} at char {error.pos})"
                    if error.pos >= len(stripped):
                        what += "; it looks truncated"
                found.error(what, text, kind="invalid_json")
            return ParseResult(text, [], found.errors)
        if not isinstance(envelope, dict):
            return ParseResult(text, [], [])
        message = self._envelope(envelope, found, stripped)
        return ParseResult(message, found.calls, found.errors)

    def _envelope(self, envelope: Mapping[str, Any], found: Collector, source: str | None) -> str:
        """Read one envelope; ``source`` (its JSON text, if any) seeds the call ids."""
        message = envelope.get("message")
        text = "" if message is None else message if isinstance(message, str) else dumps(message)
        tools = envelope.get("tools")
        if tools is None:
            return text
        seed = None if source is None else hashlib.blake2b(source.encode()).hexdigest()
        if not isinstance(tools, list):
            found.error(f'"tools" must be a list of calls, got {describe(tools)}', dumps(tools))
            return text
        try:
            self._entries(tools, found, seed)
        except ErrorFlood:
            pass  # the last error says the scan stopped
        return text

    def _entries(self, tools: list[Any], found: Collector, seed: str | None) -> None:
        for entry in tools:
            if not isinstance(entry, dict) and not isinstance(entry, Mapping):
                found.error(
                    f'each entry of "tools" must be an object, got {describe(entry)}', dumps(entry)
                )
                continue
            tool = entry.get("tool")
            if not isinstance(tool, str) or not tool:
                found.error(
                    'each entry of "tools" needs a string "tool" (the tool name)', dumps(entry)
                )
                continue
            try:
                args = decode_arguments(entry.get("args"))
            except ArgumentsError as error:
                found.error(
                    f'"args" of {tool!r}: {error.message}',
                    dumps(entry),
                    kind=error.kind,
                    tool=tool,
                )
                continue
            tag = entry.get("tag")
            call_id = ""
            if seed is not None:  # hash the envelope once, not each entry re-serialised
                call_id = make_call_id(len(found.calls), tool, args, raw=seed)
            found.call(tool, args, tag=None if tag is None else str(tag), id=call_id)

    def render(self, calls: Sequence[ToolCall], text: str = "") -> str:
        tools: list[dict[str, Any]] = []
        for call in calls:
            entry: dict[str, Any] = {"tool": call.tool, "args": call.args}
            if call.tag is not None:
                entry["tag"] = call.tag
            tools.append(entry)
        return dumps({"message": text, "tools": tools})


# --- python_block ------------------------------------------------------------------

_FENCE_OPEN = re.compile(r"```[ \t]*(?:python3?|py)[ \t]*\r?\n", re.IGNORECASE)


class PythonBlockParser(SyntaxParser):
    """Every fenced ```` ```python ```` (or ```` ```py ````) block is a call of ``python``.

    The call is ``ToolCall("python", {"code": body})``; the prose around the
    blocks stays in the visible text. An unclosed fence is reported as truncated.
    """

    name = "python_block"
    syntax = "```python\nprint('your code here')\n```"

    def near_miss_markers(self) -> tuple[str, ...]:
        return ("```python", "```py")  # e.g. code on the fence's own line

    def __init__(
        self,
        *,
        tool_name: str = "python",
        tools: Any = None,
        max_chars: int | None = DEFAULT_MAX_CHARS,
    ) -> None:
        super().__init__(tools=tools, max_chars=max_chars)
        self.tool_name = tool_name

    def _scan(self, text: str, found: Collector) -> None:
        pos = 0
        while True:
            opening = _FENCE_OPEN.search(text, pos)
            if opening is None:
                return
            close = text.find("```", opening.end())
            if close == -1:
                found.error(
                    "the ```python block is never closed with ``` (truncated?)",
                    text[opening.start() :],
                    kind="truncated",
                    tool=self.tool_name,
                )
                return
            code = text[opening.end() : close]
            if code.endswith("\n"):
                code = code[:-2] if code.endswith("\r\n") else code[:-1]
            end = close + 3
            found.call(self.tool_name, {"code": code}, raw=text[opening.start() : end])
            found.cut(opening.start(), end)
            pos = end

    def render(self, calls: Sequence[ToolCall], text: str = "") -> str:
        blocks = [f"```python\n{call.args.get('code', '')}\n```" for call in calls]
        return after_text(text, "\n".join(blocks))


# --- simple_tool and custom regexes ------------------------------------------------

_ARGS_PREFIX = "Failed to parse tool arguments: "


def _args_from_text(body: str) -> dict[str, Any]:
    """Arguments of the TorchRL simple syntax: blank means ``{}``, else a JSON object."""
    if not body.strip():
        return {}
    try:
        value = json.loads(body)
    except json.JSONDecodeError as error:
        raise ArgumentsError(str(error), truncated=error.pos >= len(body.rstrip())) from None
    except RecursionError:
        raise ArgumentsError("JSON nested too deeply") from None
    return decode_arguments(value)


class _ArgsErrorMixin(SyntaxParser):
    def _args_error(self, found: Collector, error: ArgumentsError, raw: str, tool: str) -> None:
        # TorchRL shows "Tool NAME failed:\nFailed to parse tool arguments: ...";
        # keep that prefix so the model sees the same text after switching.
        message = f"{_ARGS_PREFIX}{error.message}. Expected syntax: {self.syntax}"
        kind = "truncated" if error.truncated else "invalid_json"
        found.add(ParseFailure(message, raw, tool, kind))


class SimpleToolParser(_ArgsErrorMixin):
    """``<tool>NAME\\n{json args}</tool>`` (TorchRL's ``SimpleToolTransform`` default).

    Bad JSON is a parse error whose message starts with
    ``Failed to parse tool arguments: `` as in TorchRL.
    """

    name = "simple_tool"
    syntax = '<tool>TOOL_NAME\n{"arg": "value"}</tool>'

    def near_miss_markers(self) -> tuple[str, ...]:
        return ("<tool>", "</tool>")

    def _scan(self, text: str, found: Collector) -> None:
        for block in iter_blocks(text, "<tool>", "</tool>"):
            raw = text[block.start : block.end]
            body = block.body(text)
            name, newline, args_text = body.partition("\n")
            name = name.strip()
            if not block.closed:
                found.error(
                    "the <tool> block is never closed with </tool> (truncated?)",
                    raw,
                    kind="truncated",
                    tool=name or None,
                )
                return
            if not newline or not name:
                found.error(
                    "put the tool name alone on the first line, then the JSON arguments", raw
                )
                continue
            try:
                args = _args_from_text(args_text)
            except ArgumentsError as error:
                self._args_error(found, error, raw, name)
                continue
            found.call(name, args, raw=raw)
            found.cut(block.start, block.end)

    def render(self, calls: Sequence[ToolCall], text: str = "") -> str:
        blocks = [f"<tool>{call.tool}\n{dumps(call.args)}</tool>" for call in calls]
        return after_text(text, "\n".join(blocks))


class RegexParser(_ArgsErrorMixin):
    """A custom regex that captures the tool name and its JSON arguments.

    Groups named ``name`` and ``args`` are used when present, else groups 1
    and 2 (TorchRL's ``tool_call_pattern`` convention). Matches are cut out of
    the visible text. ``render`` needs a ``template`` with ``{name}`` and
    ``{args}`` placeholders.
    """

    name = "regex"

    def __init__(
        self,
        pattern: str | re.Pattern[str],
        *,
        flags: int = re.DOTALL,
        template: str | None = None,
        tools: Any = None,
        max_chars: int | None = DEFAULT_MAX_CHARS,
    ) -> None:
        super().__init__(tools=tools, max_chars=max_chars)
        self.pattern = re.compile(pattern, flags) if isinstance(pattern, str) else pattern
        if self.pattern.groups < 2:
            raise UserError(
                f"RegexParser pattern {self.pattern.pattern!r} must capture two groups "
                "(tool name, JSON arguments) or named groups 'name' and 'args'"
            )
        names = self.pattern.groupindex
        self._groups: tuple[int | str, int | str] = (
            ("name", "args") if "name" in names and "args" in names else (1, 2)
        )
        self.template = template
        self.syntax = template or f"text matching {self.pattern.pattern!r}"  # type: ignore[misc]

    def near_miss_markers(self) -> tuple[str, ...]:
        return ()  # the user's pattern defines the syntax; nothing to guess from

    def _scan(self, text: str, found: Collector) -> None:
        name_group, args_group = self._groups
        for match in self.pattern.finditer(text):
            name = (match.group(name_group) or "").strip()
            raw = match.group(0)
            if not name:
                found.error("the tool name is empty", raw)
                continue
            try:
                args = _args_from_text(match.group(args_group) or "")
            except ArgumentsError as error:
                self._args_error(found, error, raw, name)
                continue
            found.call(name, args, raw=raw)
            found.cut(match.start(), match.end())

    def render(self, calls: Sequence[ToolCall], text: str = "") -> str:
        if self.template is None:
            raise UserError("RegexParser.render needs template='...{name}...{args}...'")
        blocks = [self.template.format(name=c.tool, args=dumps(c.args)) for c in calls]
        return after_text(text, "\n".join(blocks))

    def __repr__(self) -> str:
        return f"RegexParser({self.pattern.pattern!r})"
