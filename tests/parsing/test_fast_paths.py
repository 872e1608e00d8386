"""Fast paths give exactly what the general scan gives, on well-formed and odd input."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as hs

from toolservices.parsing import ToolCall, get_parser, pythonic
from toolservices.parsing import special_tokens as st

B, E, CB, CE, SEP = (
    st._DS_CALLS_BEGIN,
    st._DS_CALLS_END,
    st._DS_CALL_BEGIN,
    st._DS_CALL_END,
    st._DS_SEP,
)


def _v3(name: str, payload: str) -> str:
    return f"{CB}function{SEP}{name}\n```json\n{payload}\n```{CE}"


def _v31(name: str, payload: str) -> str:
    return f"{CB}{name}{SEP}{payload}{CE}"


DEEPSEEK_INPUTS = [
    get_parser("deepseek_v3").render(
        [ToolCall("a", {"x": 1}), ToolCall("b", {"y": [1, "é"]})], "hi"
    ),
    B + _v3("a", '{"x": 1}') + E,
    B + _v3("a", '{"x": 1}') + " " + _v3("b", "{}") + E,  # a space between calls
    B + _v3(" a ", '{"x": 1}') + E,  # name with spaces
    B + _v3("a", '"{\\"x\\": 1}"') + E,  # arguments as a JSON string
    B + _v3("a", "[1]") + E,  # not an object
    B + _v3("a", '{"x": ') + E,  # bad JSON
    B + _v3("a", ' {"x": 1} ') + E,  # blanks around the object
    B + _v3("a", '{"x": 1}\n') + E,  # a blank line before the closing fence
    B + _v3("a", '{"x": 1} {"y": 2}') + E,  # two objects in one fence
    B + _v3("a", '{"s": "\n```' + CE + '"}') + E,  # the call's tail inside a string
    B + _v3("a", "5") + E,  # a number
    B + _v3("a", '{"x": 1}') + "\n" + _v3("b", "{}") + E,  # a newline between calls (V3's own)
    B + "\n " + _v3("a", "{}") + "\n" + E,  # blanks before the first call and after the last
    B + _v3("a", "{}") + " junk " + _v3("b", "{}") + E,  # text between calls
    "hi " + B + _v3("a", '{"x": 1}'),  # section never closed, its call complete
    "hi " + B + _v3("a", '{"x": 1}') + "\nmore text",  # ... and text after it
    "hi " + B + _v3("a", '{"x": 1}') + "\n",  # ... and a newline after it
    B + _v31("a", '{"x": 1}') + "\n" + _v31("b", '{"y": [1, "é"]}') + E,  # V3.1, two calls
    B + _v31("a", '{"x": 1}') + _v3("b", "{}") + E,  # V3.1 then V3
    B + _v31(" a ", " {} ") + E,  # V3.1, blanks around the name and the object
    B + _v31("a", '{"s": "' + CE + '"}') + E,  # V3.1, its end token inside a string
    B + _v31("a", '{"x": 1} {"y": 2}') + E,  # V3.1, two objects
    B + _v31("a", '"{\\"x\\": 1}"') + E,  # V3.1, arguments as a JSON string
    B + _v31("", "{}") + E,  # V3.1, no name
    B + _v31("function", '{"x": 1}') + E,  # V3.1, a tool called "function"
    B + _v31("a", '{"x": 1'),  # V3.1, cut off
    B + _v31("a", '{"s": "' + E + '"}') + E,  # the section's end token inside a string
    B + _v3("a", '{"s": "' + E + '"}') + E,  # ... in V3
    (B + f"{CB}function{SEP}a\n```json\n" + '{"x": "Pa') * 3,  # repeated cut-off prefixes
    B + _v3("a", "") + E,  # blank arguments
    B + _v3("a", '{"code": "```\\n```"}') + E,  # fences inside a string
    B + f"{CB}function{SEP}a\n```json\n{{}}```{CE}" + E,  # no newline before the fence
    B + f'{CB}a{SEP}{{"x": 1}}{CE}' + E,  # the V3.1 layout
    B + _v3("a", '{"x": 1}') + _v3("b", '{"y": 2}'),  # section never closed
    B + f"{CB}function{SEP}a\n```json\n{{}}" + E,  # call never closed
    B + _v3("a", '{"s": "\\ud800"}') + E,  # a lone surrogate by escape
    B + E,  # empty section
    "text " + B + _v3("a", "{}") + E + " more " + B + _v3("b", "{}") + E,
]


@pytest.mark.parametrize("text", DEEPSEEK_INPUTS)
@pytest.mark.parametrize("family", ["deepseek_v3", "deepseek_v31"])
def test_deepseek_fast_section_matches_the_general_scan(
    family: str, text: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    parser = get_parser(family)
    fast = parser(text)
    monkeypatch.setattr(st, "_fast_section", lambda *args: False)
    slow = parser(text)
    assert fast.text == slow.text
    assert [(c.tool, c.args, c.id, c.raw) for c in fast.calls] == [
        (c.tool, c.args, c.id, c.raw) for c in slow.calls
    ]
    assert fast.errors == slow.errors
    assert fast.meta == slow.meta


def _list_end_by_characters(text: str, start: int) -> int | None:
    """The specification of ``pythonic._list_end``: one character at a time."""
    depth = 0
    pos, size = start, len(text)
    while pos < size:
        char = text[pos]
        if char in "'\"":
            quote = text[pos : pos + 3] if text[pos : pos + 3] in ("'''", '"""') else char
            pos += len(quote)
            while pos < size and not text.startswith(quote, pos):
                pos += 2 if text[pos] == "\\" else 1
            if pos >= size:
                return None
            pos += len(quote)
            continue
        if char in "([{":
            depth += 1
        elif char in ")]}":
            depth -= 1
            if depth == 0:
                return pos + 1
        pos += 1
    return None


@settings(max_examples=2000, deadline=None)
@given(hs.text(alphabet="[](){}'\"\\ax\n", max_size=24))
def test_pythonic_list_end_matches_a_character_scan(tail: str) -> None:
    text = "[" + tail
    assert pythonic._list_end(text, 0) == _list_end_by_characters(text, 0)
