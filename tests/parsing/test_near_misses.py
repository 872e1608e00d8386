"""Text that looks like a call yields a call or a parse error, never silence (issue 12).

A "near miss" is a response with a family's call syntax in it (an opening or
closing tag, a call outside its block...) from which nothing could be read.
Each family names its markers (``near_miss_markers()``); the few deliberate
exceptions are pinned at the end.
"""
# ruff: noqa: E501  (tables of verbatim model outputs read better unwrapped)

from __future__ import annotations

import pytest

from toolservices.parsing import get_parser
from toolservices.parsing._common import SyntaxParser
from toolservices.parsing.gemma import Gemma4Parser
from toolservices.parsing.pythonic import Lfm2Parser
from toolservices.parsing.registry import PARSERS
from toolservices.parsing.xml_families import DeepSeekV4Parser

DS_CALL, DS_SEP, DS_CALL_END = "<｜tool▁call▁begin｜>", "<｜tool▁sep｜>", "<｜tool▁call▁end｜>"
DSML = "｜DSML｜"

# (family, a realistic near miss): each must give no call and a parse error.
NEAR_MISSES: list[tuple[str, str]] = [
    ("xml_block", 'Searching.\n<tool name=\'search\'>{"q": "x"}</tool>'),
    ("xml_block", 'Searching.\n<tool name="x" id="1">{}</tool>'),
    (
        "json_envelope",
        'Sure:\n```json\n{"message": "hi", "tools": [{"tool": "a", "args": {}}]}\n```',
    ),
    ("python_block", "```python print(1)```"),
    ("simple_tool", 'search\n{"q": 1}</tool>'),
    ("hermes", 'Checking.\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'),
    ("ernie45", '{"name": "f", "arguments": {}}</tool_call>'),
    ("longcat", '{"name": "f", "arguments": {}}</longcat_tool_call>'),
    ("jamba", '[{"name": "f", "arguments": {}}]</tool_calls>'),
    ("hunyuan_a13b", '[{"name": "f", "arguments": {}}]</tool_calls>'),
    ("minimax", '{"name": "f", "arguments": {}}\n</tool_calls>'),
    ("internlm", '{"name": "f", "parameters": {}}<|action_end|>'),
    ("granite", "<|tool_call|> I will call get_weather now."),
    ("granite-20b-fc", "<function_call> get_weather(city='Paris')"),
    ("phi4_mini_json", "functools get_weather(city='Paris')"),
    ("gigachat3", "<|function_call|>get_weather(city='Paris')"),
    ("llama3_json", "{'name': 'get_weather', 'parameters': {'city': 'Paris'}}"),
    ("llama3_json", '{"parameters": {"city": "Paris"}}'),
    ("llama3_json", "<|python_tag|>get_weather(city='Paris')"),
    ("mistral", "[TOOL_CALLS] I will look it up."),
    ("xlam", '{"name": "f", "arguments": {}}</tool_call>'),
    ("llama4_pythonic", "<|python_start|>get_weather(city='Paris')<|python_end|>"),
    ("olmo3", "get_weather(city='Paris')\n</function_calls>"),
    ("deepseek_v3", f"{DS_CALL}function{DS_SEP}get_weather\n```json\n{{}}\n```{DS_CALL_END}"),
    ("deepseek_v31", f'{DS_CALL}get_weather{DS_SEP}{{"city": "Paris"}}{DS_CALL_END}'),
    (
        "deepseek_v32",
        f'<{DSML}invoke name="f">\n<{DSML}parameter name="a" string="true">x</{DSML}parameter>\n</{DSML}invoke>',
    ),
    (
        "kimi_k2",
        '<|tool_call_begin|>functions.f:0<|tool_call_argument_begin|>{"a": 1}<|tool_call_end|>',
    ),
    ("glm45", "get_weather\n<arg_key>city</arg_key>\n<arg_value>Paris</arg_value>\n</tool_call>"),
    ("minimax_m2", '<invoke name="f">\n<parameter name="a">1</parameter>\n</invoke>'),
    (
        "openai",
        "<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json",
    ),
    (
        "step3",
        '<steptml:invoke name="f"><steptml:parameter name="a">1</steptml:parameter></steptml:invoke>',
    ),
    ("seed_oss", "<function=f>\n<parameter=a>\n1\n</parameter>\n</function>"),
    ("qwen3_coder", 'Checking.\n{"name": "f", "arguments": {}}\n</tool_call>'),
    ("functiongemma", "call:f{a:<escape>x<escape>}<end_function_call>"),
]

# Families whose markers cannot be told from prose: the syntax itself is the
# only signal, and a malformed list in a sentence is taken as prose on purpose.
NO_MARKERS = {"pythonic", "regex"}


@pytest.mark.parametrize(("family", "response"), NEAR_MISSES)
def test_near_miss_is_a_parse_error(family: str, response: str) -> None:
    parser = get_parser(family)
    result = parser(response)
    assert result.calls == []
    assert result.errors, f"{family}: silent near miss"
    error = result.errors[0]
    assert error.message.startswith("Could not parse")
    assert "Expected syntax" in error.message
    assert result.text  # the text is kept for the conversation


def test_every_family_has_a_near_miss_case() -> None:
    covered = {family for family, _ in NEAR_MISSES}
    mine = {
        name
        for name, cls in PARSERS.items()
        # the 2026 families have their own near-miss cases in test_new_families.py
        if cls not in (Gemma4Parser, DeepSeekV4Parser, Lfm2Parser)
    }
    assert mine - covered - NO_MARKERS == set()


@pytest.mark.parametrize("family", sorted(PARSERS))
def test_each_marker_alone_gives_a_call_or_an_error(family: str) -> None:
    parser = get_parser(family)
    assert isinstance(parser, SyntaxParser)
    markers = parser.near_miss_markers()
    if family not in NO_MARKERS:
        assert markers, f"{family} declares no near-miss marker"
    for marker in markers:
        result = parser(f"Let me think. {marker} Then more text.")
        assert result.calls or result.errors, f"{family}: {marker!r} was silently ignored"


@pytest.mark.parametrize("family", sorted(PARSERS))
def test_well_formed_calls_are_not_near_misses(family: str) -> None:
    from toolservices.parsing import ToolCall

    parser = get_parser(family)
    call = (
        ToolCall("python", {"code": "x = 1"})
        if family == "python_block"
        else ToolCall("f", {"a": "b"})
    )
    result = parser(parser.render([call, call], "Some prose."))
    assert result.errors == []
    assert len(result.calls) == 2


def test_deliberate_silences() -> None:
    # A bracketed call-like list inside a sentence is prose for the pythonic family.
    result = get_parser("pythonic")("As documented, [f(x)] is how calls look, not a call.")
    assert result.calls == [] and result.errors == []
    # A JSON object in prose that is not a call stays text for llama3_json.
    result = get_parser("llama3_json")('The user is {"name": "Bob", "age": 3}.')
    assert result.calls == [] and result.errors == []
