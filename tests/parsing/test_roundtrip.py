"""Property tests: ``parse(render(calls, text))`` gives back the calls and the text."""

from __future__ import annotations

import keyword
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from toolservices.parsing import ToolCall, get_parser
from toolservices.parsing.json_families import MistralParser
from toolservices.parsing.registry import PARSERS

# Strings avoid "<", ">", "`" and the fullwidth bar: inside a string they could
# spell a closing tag, which no format can tell from the real one.
_SAFE = st.characters(blacklist_categories=("Cs",), blacklist_characters="<>`｜\x00")
safe_text = st.text(_SAFE, max_size=20)
identifier = st.from_regex(r"[a-z_][a-z0-9_]{0,12}", fullmatch=True).filter(
    lambda name: not keyword.iskeyword(name)
)
scalars = (
    st.none()
    | st.booleans()
    | st.integers(-(10**12), 10**12)
    | st.floats(allow_nan=False, allow_infinity=False, width=64)
    | safe_text
)
json_values = st.recursive(
    scalars,
    lambda children: (
        st.lists(children, max_size=3) | st.dictionaries(identifier, children, max_size=3)
    ),
    max_leaves=8,
)
prose = st.text(
    st.characters(whitelist_categories=("L", "N", "Zs"), whitelist_characters=".,!?'-"),
    max_size=40,
).map(str.strip)


def calls_of(
    values: st.SearchStrategy[Any], max_calls: int = 4
) -> st.SearchStrategy[list[ToolCall]]:
    call = st.builds(ToolCall, identifier, st.dictionaries(identifier, values, max_size=4))
    return st.lists(call, min_size=1, max_size=max_calls)


JSON_FAMILIES = [
    "xml_block",
    "json_envelope",
    "simple_tool",
    "hermes",
    "llama3_json",
    "mistral",
    "deepseek_v3",
    "deepseek_v31",
    "deepseek_v32",
    "kimi_k2",
    "jamba",
    "hunyuan_a13b",
    "minimax",
    "granite",
    "granite-20b-fc",
    "internlm",
    "longcat",
    "ernie45",
    "xlam",
    "phi4_mini_json",
    "gigachat3",
    "openai",
    "gemma4",
    "deepseek_v4",
]
PYTHON_FAMILIES = ["pythonic", "llama4_pythonic", "olmo3", "lfm2"]
TEXT_FAMILIES = ["qwen3_coder", "seed_oss", "minimax_m2", "glm45", "step3"]

SETTINGS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _check(family: str, calls: list[ToolCall], text: str, **kwargs: Any) -> None:
    parser = get_parser(family, **kwargs)
    rendered = parser.render(calls, text)
    result = parser(rendered)
    assert result.errors == [], (rendered, result.errors)
    assert [(c.tool, c.args) for c in result.calls] == [(c.tool, c.args) for c in calls], rendered
    assert result.text == text, rendered


@pytest.mark.parametrize("family", JSON_FAMILIES)
@SETTINGS
@given(calls=calls_of(json_values), text=prose)
def test_json_families_round_trip(family: str, calls: list[ToolCall], text: str) -> None:
    _check(family, calls, text)


@SETTINGS
@given(calls=calls_of(json_values), text=prose)
def test_mistral_pre_v11_round_trip(calls: list[ToolCall], text: str) -> None:
    parser = MistralParser(variant="pre_v11")
    result = parser(parser.render(calls, text))
    assert [(c.tool, c.args) for c in result.calls] == [(c.tool, c.args) for c in calls]
    assert result.text == text


@pytest.mark.parametrize("family", PYTHON_FAMILIES)
@SETTINGS
@given(calls=calls_of(json_values), text=prose)
def test_python_families_round_trip(family: str, calls: list[ToolCall], text: str) -> None:
    _check(family, calls, text)


_RAW = st.text(_SAFE, max_size=20).filter(
    lambda s: not s.startswith(("\n", "\r")) and not s.endswith(("\n", "\r"))
)


@pytest.mark.parametrize("family", TEXT_FAMILIES)
@SETTINGS
@given(calls=calls_of(_RAW), text=prose)
def test_text_valued_families_round_trip(family: str, calls: list[ToolCall], text: str) -> None:
    _check(family, calls, text)


TYPED_SPEC = {
    "name": "typed",
    "parameters": {
        "type": "object",
        "properties": {
            "n": {"type": "integer"},
            "flag": {"type": "boolean"},
            "items": {"type": "array"},
            "opts": {"type": "object"},
            "label": {"type": "string"},
        },
    },
}
typed_args = st.fixed_dictionaries(
    {},
    optional={
        "n": st.integers(-(10**9), 10**9),
        "flag": st.booleans(),
        "items": st.lists(json_values, max_size=3),
        "opts": st.dictionaries(identifier, json_values, max_size=3),
        "label": _RAW,
    },
)


@pytest.mark.parametrize("family", TEXT_FAMILIES)
@SETTINGS
@given(args=st.lists(typed_args, min_size=1, max_size=3), text=prose)
def test_schema_typed_round_trip(family: str, args: list[dict[str, Any]], text: str) -> None:
    _check(family, [ToolCall("typed", a) for a in args], text, tools=[TYPED_SPEC])


def test_functiongemma_round_trip_example() -> None:
    calls = [
        ToolCall("get_weather", {"city": "Paris, France", "days": 3, "metric": True}),
        ToolCall("search", {"q": "a{b}:c", "tags": ["x", "1"], "opts": {"deep": None}}),
    ]
    _check("functiongemma", calls, "Sure.")


@SETTINGS
@given(codes=st.lists(st.text(_SAFE, max_size=30).filter(lambda s: "```" not in s), min_size=1))
def test_python_block_round_trip(codes: list[str]) -> None:
    calls = [ToolCall("python", {"code": code.strip("\r\n")}) for code in codes]
    _check("python_block", calls, "")


_FRAGMENTS = [
    "<tool_call>", "</tool_call>", "<tool_calls>", "</tool_calls>", '<tool name="a">', "</tool>",
    "<tool>", "[TOOL_CALLS]", "[ARGS]", "[CALL_ID]", "<function=f>", "</function>",
    "<parameter=p>", "</parameter>", '<invoke name="f">', "</invoke>", '<parameter name="p">',
    "<minimax:tool_call>", "<｜tool▁calls▁begin｜>", "<｜tool▁call▁begin｜>", "<｜tool▁sep｜>",
    "<｜tool▁call▁end｜>", "<｜tool▁calls▁end｜>", "<|tool_calls_section_begin|>",
    "<|tool_call_begin|>", "<|tool_call_argument_begin|>", "<|tool_call_end|>", "<arg_key>",
    "</arg_key>", "<arg_value>", "</arg_value>", "<function_calls>", "</function_calls>",
    "<|python_start|>", "<|python_end|>", "<|python_tag|>", "```python\n", "```json\n", "```",
    "<start_function_call>", "call:f", "<escape>", "<end_function_call>", "<|channel|>",
    "<|message|>", "<|call|>", "<|end|>", "<|start|>", "to=functions.f", "functools",
    '{"name": "f", "arguments": ', '{"name": "f", "parameters": {', '"message": ', '"tools": [',
    "{", "}", "[", "]", "(", ")", "f(", "a=", "'x'", '"y"', "1", "-2.5", "true", "null", ",", ";",
    ":", "\n", " ", "é", "東", "\\", "'''",
    "<|tool_call>", "<tool_call|>", '<|"|>', "call:f{", "<|tool_call_start|>", "<|tool_call_end|>",
    "<｜DSML｜tool_calls>", "</｜DSML｜tool_calls>", '<｜DSML｜invoke name="f">',
    "</｜DSML｜invoke>",
]  # fmt: skip


@settings(max_examples=150, deadline=None)
@given(pieces=st.lists(st.sampled_from(_FRAGMENTS), max_size=30))
def test_no_family_raises_on_fragment_soup(pieces: list[str]) -> None:
    response = "".join(pieces)
    for family in sorted(PARSERS):
        result = get_parser(family)(response)
        assert isinstance(result.text, str)
        assert all(isinstance(call.args, dict) and call.tool for call in result.calls)
        assert result.meta["count"] == len(result.calls)
