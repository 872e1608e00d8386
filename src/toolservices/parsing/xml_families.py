"""Families that write each argument as an XML-ish element with a raw text value.

Values are raw text (``<parameter=n>5</parameter>``); they are converted with
the tool's JSON Schema when the parser was given ``tools=`` (``"5"`` becomes
``5`` for an integer parameter) and kept as strings otherwise. DeepSeek-V3.2
marks each value ``string="true|false"`` itself: non-strings are JSON.

* function style: ``<function=NAME><parameter=K>V</parameter></function>``
  (``qwen3_coder`` / ``qwen3_xml``, ``seed_oss``);
* invoke style: ``<invoke name="N"><parameter name="K">V</parameter></invoke>``
  (``minimax_m2``, ``deepseek_v32``, ``step3``);
* ``glm45``: ``<tool_call>NAME<arg_key>K</arg_key><arg_value>V</arg_value></tool_call>``;
* ``deepseek_v4``: the DeepSeek-V3.2 DSML grammar inside ``<｜DSML｜tool_calls>``; an
  invoke body may instead be one JSON object of arguments.

Missing ``</parameter>`` / ``</function>`` tags inside a closed block are
tolerated (Qwen3-Coder drops them); a block cut off before its function or
invoke is complete is reported as truncated.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any, ClassVar

from toolservices.parsing._common import (
    Block,
    Collector,
    SyntaxParser,
    after_text,
    iter_blocks,
    segments,
    xml_params,
)
from toolservices.parsing._json import ArgumentsError, arguments_from_text, dumps
from toolservices.parsing.base import ToolCall

__all__ = [
    "DeepSeekV32Parser",
    "DeepSeekV4Parser",
    "Glm45Parser",
    "MiniMaxM2Parser",
    "Qwen3CoderParser",
    "SeedOssParser",
    "Step3Parser",
]


def _text_value(value: Any) -> str:
    return value if isinstance(value, str) else dumps(value)


def _sections(body: str, opening: re.Pattern[str], close: str) -> list[tuple[str, str, bool]]:
    """``(name, inner text, closed)`` per opening match; a section ends at ``close``
    or, when the model forgot it, at the next opening."""
    sections: list[tuple[str, str, bool]] = []
    for match, inner in segments(body, opening):
        end = inner.find(close)
        sections.append((match.group(1).strip(), inner if end == -1 else inner[:end], end != -1))
    return sections


class _ParamParser(SyntaxParser):
    """Shared scan: outer blocks -> function/invoke sections -> parameters."""

    open_tag: ClassVar[str]
    close_tag: ClassVar[str]
    section_re: ClassVar[re.Pattern[str]]
    section_close: ClassVar[str]
    #: The literal start of a section (``<function=``), for near misses.
    section_marker: ClassVar[str]
    param_re: ClassVar[re.Pattern[str]]
    param_close: ClassVar[str]
    #: What the model should write inside the outer block, for error messages.
    inner_hint: ClassVar[str]
    #: How render() writes a parameter ({name}, {value}, {string}: "true" for a str
    #: value), a call ({tool}, {params}, {open}, {close}) and the calls ({calls}, ...).
    param_template: ClassVar[str]
    call_template: ClassVar[str]
    block_template: ClassVar[str] = "{open}\n{calls}{close}"
    call_sep: ClassVar[str] = ""

    def render(self, calls: Sequence[ToolCall], text: str = "") -> str:
        tags = {"open": self.open_tag, "close": self.close_tag}
        rendered = self.call_sep.join(
            self.call_template.format(
                tool=call.tool,
                params="".join(
                    self.param_template.format(
                        name=k, value=_text_value(v), string=str(isinstance(v, str)).lower()
                    )
                    for k, v in call.args.items()
                ),
                **tags,
            )
            for call in calls
        )
        return after_text(text, self.block_template.format(calls=rendered, **tags))

    def _value(self, tool: str, match: re.Match[str], raw: str) -> Any:
        return self.schemas.coerce(tool, match.group(1).strip(), raw)

    def near_miss_markers(self) -> tuple[str, ...]:
        """The block tags (a stray closing tag: the opening is missing) and the
        section opening outside any block. The latter only when declared with
        (or below) the class that sets the block tags: a subclass that wraps the
        same sections in new tags (DeepSeek-V4 around V3.2's invokes) leaves the
        older wrapper's output as plain text."""
        markers: tuple[str, ...] = (self.open_tag, self.close_tag)
        mro = type(self).__mro__
        owner = next(i for i, cls in enumerate(mro) if "open_tag" in vars(cls))
        if any("section_marker" in vars(cls) for cls in mro[: owner + 1]):
            markers += (self.section_marker,)
        return markers

    def _section_args(self, name: str, inner: str) -> dict[str, Any]:
        return {
            match.group(1).strip(): self._value(name, match, value)
            for match, value in xml_params(
                inner, self.param_re, self.param_close, stops=(self.section_close,)
            )
        }

    def _gap(self, text: str, start: int, end: int, found: Collector) -> None:
        """Read ``text[start:end]``, which lies outside every block (nothing by default)."""

    def _scan(self, text: str, found: Collector) -> None:
        previous = 0
        for block in iter_blocks(text, self.open_tag, self.close_tag):
            self._gap(text, previous, block.start, found)
            previous = block.end
            self._block(text, block, found)
        self._gap(text, previous, len(text), found)

    def _block(self, text: str, block: Block, found: Collector) -> None:
        raw = text[block.start : block.end]
        sections = _sections(block.body(text), self.section_re, self.section_close)
        if not sections:
            what = f"inside {self.open_tag} write {self.inner_hint}"
            if not block.closed:
                what = f"the {self.open_tag} block is cut off (truncated?); {what}"
            found.error(what, raw, kind="invalid_syntax" if block.closed else "truncated")
            return
        if not block.closed and not sections[-1][2]:
            found.error(
                f"the call is cut off before {self.section_close} (truncated?)",
                raw,
                kind="truncated",
                tool=sections[-1][0] or None,
            )
            return
        if any(not name for name, _, _ in sections):
            found.error(f"a tool name is missing: write {self.inner_hint}", raw)
            return
        for name, inner, _ in sections:
            found.call(name, self._section_args(name, inner), raw=raw)
        found.cut(block.start, block.end)


_STRAY_CLOSE = re.compile(r"\s*</tool_call>")


class Qwen3CoderParser(_ParamParser):
    """Qwen3-Coder and later Qwen: ``<tool_call><function=NAME><parameter=K>V</parameter>...``."""

    name = "qwen3_coder"
    open_tag = "<tool_call>"
    close_tag = "</tool_call>"
    section_re = re.compile(r"<function=([^>\n]*)>")
    section_close = "</function>"
    section_marker = "<function="
    param_re = re.compile(r"<parameter=([^>\n]*)>")
    param_close = "</parameter>"
    inner_hint = "<function=TOOL_NAME> with one <parameter=NAME>value</parameter> per argument"
    param_template = "<parameter={name}>\n{value}\n</parameter>\n"
    call_template = "{open}\n<function={tool}>\n{params}</function>\n{close}"
    block_template = "{calls}"
    call_sep = "\n"
    syntax = (
        "<tool_call>\n<function=TOOL_NAME>\n<parameter=ARG_NAME>\nvalue\n</parameter>\n"
        "</function>\n</tool_call>"
    )
    #: Qwen3-Coder also writes ``<function=...>...</function>`` with no
    #: ``<tool_call>`` around it (sometimes with a stray ``</tool_call>`` after):
    #: read those too.
    bare_functions: ClassVar[bool] = True

    def _gap(self, text: str, start: int, end: int, found: Collector) -> None:
        if not self.bare_functions or text.find(self.section_marker, start, end) == -1:
            return
        gap = text[start:end]
        pieces = segments(gap, self.section_re)
        for index, (match, inner) in enumerate(pieces):
            name = match.group(1).strip()
            close = inner.find(self.section_close)
            call_start = start + match.start()
            if close == -1 and index == len(pieces) - 1:
                found.error(
                    f"the call is cut off before {self.section_close} (truncated?)",
                    text[call_start : call_start + 2000],
                    kind="truncated",
                    tool=name or None,
                )
                return
            body = inner if close == -1 else inner[:close]
            call_end = start + match.end() + len(body)
            if close != -1:
                call_end += len(self.section_close)
                stray = _STRAY_CLOSE.match(gap, call_end - start)
                if stray is not None:
                    call_end = start + stray.end()
            raw = text[call_start:call_end]
            if not name:
                found.error(f"a tool name is missing: write {self.inner_hint}", raw)
                continue
            found.call(name, self._section_args(name, body), raw=raw)
            found.cut(call_start, call_end)


class SeedOssParser(Qwen3CoderParser):
    """ByteDance Seed-OSS: the Qwen3-Coder layout inside ``<seed:tool_call>``."""

    name = "seed_oss"
    bare_functions = False
    section_marker = "<function="
    open_tag = "<seed:tool_call>"
    close_tag = "</seed:tool_call>"
    syntax = (
        "<seed:tool_call>\n<function=TOOL_NAME>\n<parameter=ARG_NAME>value</parameter>\n"
        "</function>\n</seed:tool_call>"
    )


class MiniMaxM2Parser(_ParamParser):
    """MiniMax-M2: ``<minimax:tool_call><invoke name="N"><parameter name="K">V</parameter>``."""

    name = "minimax_m2"
    open_tag = "<minimax:tool_call>"
    close_tag = "</minimax:tool_call>"
    section_re = re.compile(r'<invoke\s+name="?([^">\n]*)"?\s*>')
    section_close = "</invoke>"
    section_marker = "<invoke"
    param_re = re.compile(r'<parameter\s+name="?([^">\n]*)"?\s*>')
    param_close = "</parameter>"
    inner_hint = '<invoke name="TOOL_NAME"> with <parameter name="ARG">value</parameter>'
    param_template = '<parameter name="{name}">{value}</parameter>\n'
    call_template = '<invoke name="{tool}">\n{params}</invoke>\n'
    syntax = (
        '<minimax:tool_call>\n<invoke name="TOOL_NAME">\n<parameter name="ARG_NAME">value'
        "</parameter>\n</invoke>\n</minimax:tool_call>"
    )


_DSML = "｜DSML｜"


class DeepSeekV32Parser(_ParamParser):
    """DeepSeek-V3.2 DSML; ``string="false"`` values are JSON, ``"true"`` ones text."""

    name = "deepseek_v32"
    open_tag = f"<{_DSML}function_calls>"
    close_tag = f"</{_DSML}function_calls>"
    section_re = re.compile(rf'<{_DSML}invoke\s+name="([^"]*)"\s*>')
    section_close = f"</{_DSML}invoke>"
    section_marker = f"<{_DSML}invoke"
    param_re = re.compile(rf'<{_DSML}parameter\s+name="([^"]*)"(?:\s+string="(true|false)")?\s*>')
    param_close = f"</{_DSML}parameter>"
    inner_hint = f'<{_DSML}invoke name="TOOL_NAME"> with parameters'
    param_template = (
        f'<{_DSML}parameter name="{{name}}" string="{{string}}">{{value}}</{_DSML}parameter>\n'
    )
    call_template = f'<{_DSML}invoke name="{{tool}}">\n{{params}}</{_DSML}invoke>\n'
    syntax = (
        f'<{_DSML}function_calls>\n<{_DSML}invoke name="TOOL_NAME">\n'
        f'<{_DSML}parameter name="ARG" string="true">text</{_DSML}parameter>\n'
        f'<{_DSML}parameter name="N" string="false">5</{_DSML}parameter>\n'
        f"</{_DSML}invoke>\n</{_DSML}function_calls>"
    )

    def _value(self, tool: str, match: re.Match[str], raw: str) -> Any:
        if match.group(2) == "false":
            try:
                return json.loads(raw)
            except (json.JSONDecodeError, RecursionError):
                pass  # not JSON after all: fall back to the schema, as for other families
        elif match.group(2) == "true":
            return raw
        return super()._value(tool, match, raw)


class Step3Parser(_ParamParser):
    """StepFun Step3: ``<steptml:invoke>`` elements inside the ``<｜tool_calls_begin｜>`` block."""

    name = "step3"
    open_tag = "<｜tool_calls_begin｜>"
    close_tag = "<｜tool_calls_end｜>"
    section_re = re.compile(r'<steptml:invoke\s+name="([^"]*)"\s*>')
    section_close = "</steptml:invoke>"
    section_marker = "<steptml:invoke"
    param_re = re.compile(r'<steptml:parameter\s+name="([^"]*)"\s*>')
    param_close = "</steptml:parameter>"
    inner_hint = '<steptml:invoke name="TOOL_NAME"> with <steptml:parameter name="ARG">'
    param_template = '<steptml:parameter name="{name}">{value}</steptml:parameter>'
    call_template = (
        '<｜tool_call_begin｜>function<｜tool_sep｜><steptml:invoke name="{tool}">{params}'
        "</steptml:invoke><｜tool_call_end｜>"
    )
    block_template = "{open}{calls}{close}"
    syntax = (
        "<｜tool_calls_begin｜><｜tool_call_begin｜>function<｜tool_sep｜>"
        '<steptml:invoke name="TOOL_NAME"><steptml:parameter name="ARG">value'
        "</steptml:parameter></steptml:invoke><｜tool_call_end｜><｜tool_calls_end｜>"
    )


_GLM_VALUE = re.compile(r"\s*<arg_value>")


def _glm_pairs(body: str) -> list[tuple[str, str]]:
    """``<arg_key>K</arg_key><arg_value>V</arg_value>`` pairs, in one pass.

    A value whose ``</arg_value>`` is missing runs to the end of the body.
    """
    pairs: list[tuple[str, str]] = []
    pos = 0
    while (key := body.find("<arg_key>", pos)) != -1:
        key_end = body.find("</arg_key>", key + 9)
        if key_end == -1:
            break
        value = _GLM_VALUE.match(body, key_end + 10)
        if value is None:
            pos = key_end + 10
            continue
        value_end = body.find("</arg_value>", value.end())
        if value_end == -1:
            pairs.append((body[key + 9 : key_end], body[value.end() :].removesuffix("\n")))
            break
        pairs.append((body[key + 9 : key_end], body[value.end() : value_end]))
        pos = value_end + 12
    return pairs


class Glm45Parser(SyntaxParser):
    """GLM-4.5/4.6/4.7: ``<tool_call>NAME`` + ``<arg_key>K</arg_key><arg_value>V</arg_value>``."""

    def near_miss_markers(self) -> tuple[str, ...]:
        return ("<tool_call>", "</tool_call>", "<arg_key>")

    name = "glm45"
    syntax = (
        "<tool_call>TOOL_NAME\n<arg_key>ARG_NAME</arg_key>\n<arg_value>value</arg_value>\n"
        "</tool_call>"
    )

    def _scan(self, text: str, found: Collector) -> None:
        for block in iter_blocks(text, "<tool_call>", "</tool_call>"):
            raw = text[block.start : block.end]
            body = block.body(text)
            first = body.find("<arg_key>")
            name = (body if first == -1 else body[:first]).strip()
            if not block.closed:
                found.error(
                    "the <tool_call> block is never closed with </tool_call> (truncated?)",
                    raw,
                    kind="truncated",
                    tool=name.split("\n")[0] or None,
                )
                continue
            if not name or "\n" in name or name.startswith(("{", "<")):
                found.error("write the tool name right after <tool_call>, then the arguments", raw)
                continue
            args = {
                key.strip(): self.schemas.coerce(name, key.strip(), value)
                for key, value in _glm_pairs(body)
            }
            found.call(name, args, raw=raw)
            found.cut(block.start, block.end)

    def render(self, calls: Sequence[ToolCall], text: str = "") -> str:
        blocks = []
        for call in calls:
            pairs = "".join(
                f"<arg_key>{k}</arg_key>\n<arg_value>{_text_value(v)}</arg_value>\n"
                for k, v in call.args.items()
            )
            blocks.append(f"<tool_call>{call.tool}\n{pairs}</tool_call>")
        return after_text(text, "\n".join(blocks))


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
