"""Malformed output never raises: a parse error the model can learn from, text kept."""
# ruff: noqa: E501  (tables of verbatim model outputs read better unwrapped)

from __future__ import annotations

import pytest

from toolservices.parsing import get_parser
from toolservices.parsing.registry import PARSERS

DS_BEGIN, DS_CALL, DS_SEP = "<｜tool▁calls▁begin｜>", "<｜tool▁call▁begin｜>", "<｜tool▁sep｜>"
DS_CALL_END, DS_END = "<｜tool▁call▁end｜>", "<｜tool▁calls▁end｜>"
DSML = "｜DSML｜"

# (family, response, expected error kind, fragment of the message)
MALFORMED: list[tuple[str, str, str, str]] = [
    # truncated generations (hit the length limit inside a call)
    (
        "hermes",
        'Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Par',
        "truncated",
        "never closed",
    ),
    (
        "llama3_json",
        'Sure: {"name": "get_weather", "parameters": {"city": "Pa',
        "truncated",
        "brackets and quotes",
    ),
    ("mistral", '[TOOL_CALLS]get_weather{"city": "Pa', "truncated", "brackets and quotes"),
    (
        "mistral",
        '[TOOL_CALLS] [{"name": "a", "arguments": {}}, {"name": "b", "argu',
        "truncated",
        "brackets",
    ),
    ("pythonic", "[get_weather(city='Par", "truncated", "never closed with ']'"),
    ("llama4_pythonic", "<|python_start|>[f(a=1", "truncated", "never closed"),
    (
        "olmo3",
        "<function_calls>get_weather(city='Paris')\nget_time(tz=",
        "truncated",
        "never closed",
    ),
    (
        "qwen3_coder",
        "Checking.\n<tool_call>\n<function=get_weather>\n<parameter=city>\nPar",
        "truncated",
        "</function>",
    ),
    (
        "deepseek_v3",
        "Ok" + DS_BEGIN + DS_CALL + "function" + DS_SEP + 'get_weather\n```json\n{"ci',
        "truncated",
        "cut off",
    ),
    (
        "deepseek_v31",
        DS_BEGIN + DS_CALL + "get_weather" + DS_SEP + '{"city": "Pa',
        "truncated",
        "cut off",
    ),
    (
        "deepseek_v32",
        f'<{DSML}function_calls>\n<{DSML}invoke name="f">\n<{DSML}parameter name="a" string="true">x',
        "truncated",
        "cut off",
    ),
    (
        "kimi_k2",
        '<|tool_calls_section_begin|><|tool_call_begin|>functions.f:0<|tool_call_argument_begin|>{"a": ',
        "truncated",
        "never closed",
    ),
    (
        "glm45",
        "<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Pa",
        "truncated",
        "never closed",
    ),
    (
        "minimax_m2",
        '<minimax:tool_call>\n<invoke name="f">\n<parameter name="a">x',
        "truncated",
        "</invoke>",
    ),
    ("seed_oss", "<seed:tool_call>\n<function=f>\n<parameter=a>1", "truncated", "</function>"),
    ("jamba", '<tool_calls>[{"name": "a", "arguments": {}}, {"na', "truncated", "never closed"),
    ("granite", '<|tool_call|>[{"name": "a", "arguments": {', "truncated", "brackets"),
    (
        "internlm",
        '<|action_start|><|plugin|>\n{"name": "a", "parameters": {',
        "truncated",
        "never closed",
    ),
    ("xlam", '[{"name": "a", "arguments": {"x": 1}', "truncated", "brackets"),
    ("functiongemma", "<start_function_call>call:f{a:<escape>xx", "truncated", "<escape>"),
    ("python_block", "Run:\n```python\nprint(1", "truncated", "never closed"),
    ("simple_tool", '<tool>add\n{"a": 1', "truncated", "never closed"),
    ("xml_block", '<tool name="a">{"x": 1', "truncated", "never closed"),
    # bad JSON inside a complete block
    (
        "hermes",
        '<tool_call>\n{"name": "get_weather", "arguments": {city: Paris}}\n</tool_call>',
        "invalid_json",
        "invalid JSON",
    ),
    (
        "hermes",
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}\n</tool_call>',
        "invalid_json",
        "invalid JSON",
    ),
    ("llama3_json", '{"name": "f", "parameters": {"a": }}', "invalid_json", "invalid JSON"),
    (
        "deepseek_v3",
        DS_BEGIN
        + DS_CALL
        + "function"
        + DS_SEP
        + 'f\n```json\n{"a": b}\n```'
        + DS_CALL_END
        + DS_END,
        "invalid_json",
        "invalid JSON",
    ),
    (
        "kimi_k2",
        '<|tool_calls_section_begin|><|tool_call_begin|>functions.f:0<|tool_call_argument_begin|>{"a": x}<|tool_call_end|><|tool_calls_section_end|>',
        "invalid_json",
        "invalid JSON",
    ),
    (
        "simple_tool",
        "<tool>add\n{bad}</tool>",
        "invalid_json",
        "Failed to parse tool arguments: Expecting property name",
    ),
    (
        "json_envelope",
        '{"message": "hi", "tools": [{"tool": "a", "args": {',
        "invalid_json",
        "not valid JSON",
    ),
    # arguments of the wrong shape
    (
        "hermes",
        '<tool_call>{"name": "f", "arguments": "just text"}</tool_call>',
        "invalid_json",
        "must be a JSON object",
    ),
    (
        "hermes",
        '<tool_call>{"name": "f", "arguments": [1, 2]}</tool_call>',
        "invalid_json",
        "must be a JSON object",
    ),
    ("hermes", '<tool_call>{"arguments": {}}</tool_call>', "invalid_syntax", 'string "name"'),
    ("hermes", "<tool_call></tool_call>", "invalid_json", "empty"),
    ("mistral", '[TOOL_CALLS]get_weather["Paris"]', "invalid_json", "must be a JSON object"),
    ("pythonic", "[get_weather('Paris')]", "invalid_syntax", "keyword only"),
    ("pythonic", "[get_weather(city=Paris)]", "invalid_syntax", "not a literal"),
    ("pythonic", "[get_weather(**{'city': 'x'})]", "invalid_syntax", "unpacking"),
    (
        "olmo3",
        "<function_calls>f(a=1)\nx = 1</function_calls>",
        "invalid_syntax",
        "not a function call",
    ),
    # unknown syntax inside a call block (the model mixed up formats)
    (
        "hermes",
        '<tool_call>\nget_weather(city="Paris")\n</tool_call>',
        "invalid_json",
        "invalid JSON",
    ),
    (
        "qwen3_coder",
        '<tool_call>\n{"name": "get_weather", "arguments": {}}\n</tool_call>',
        "invalid_syntax",
        "<function=TOOL_NAME>",
    ),
    (
        "qwen3_coder",
        "<tool_call>\n<function=>\n</function>\n</tool_call>",
        "invalid_syntax",
        "name is missing",
    ),
    (
        "minimax_m2",
        '<minimax:tool_call>\n{"name": "f"}\n</minimax:tool_call>',
        "invalid_syntax",
        "<invoke name=",
    ),
    ("glm45", '<tool_call>{"name": "f"}</tool_call>', "invalid_syntax", "tool name right after"),
    (
        "deepseek_v3",
        DS_BEGIN + DS_CALL + 'f {"a": 1}' + DS_CALL_END + DS_END,
        "invalid_syntax",
        DS_SEP,
    ),
    (
        "functiongemma",
        "<start_function_call>f(a=1)<end_function_call>",
        "invalid_syntax",
        "call:TOOL_NAME",
    ),
    # words after the token are never a tool name (issue 12): say what is expected
    ("mistral", "[TOOL_CALLS] hello there", "invalid_syntax", "found 'hello there'"),
    # newer families (more cases in test_new_families.py)
    ("gemma4", 'Checking.<|tool_call>call:get_weather{city:<|"|>Par', "truncated", "never closed"),
    ("gemma4", "<|tool_call>call:f{a 1}<tool_call|>", "invalid_syntax", "key:value"),
    (
        "deepseek_v4",
        f'<{DSML}tool_calls>\n<{DSML}invoke name="f">\n<{DSML}parameter name="a" string="true">x',
        "truncated",
        "cut off",
    ),
    (
        "deepseek_v4",
        f'<{DSML}tool_calls><{DSML}invoke name="f">{{"a": x}}</{DSML}invoke></{DSML}tool_calls>',
        "invalid_json",
        "invalid JSON",
    ),
    ("lfm2", "<|tool_call_start|>[get_weather(city='Par", "truncated", "never closed"),
    (
        "lfm2",
        "<|tool_call_start|>[get_weather('Paris')]<|tool_call_end|>",
        "invalid_syntax",
        "keyword only",
    ),
]


@pytest.mark.parametrize(("family", "response", "kind", "fragment"), MALFORMED)
def test_malformed_output_is_reported_not_raised(
    family: str, response: str, kind: str, fragment: str
) -> None:
    parser = get_parser(family)
    result = parser(response)
    assert result.calls == []
    assert len(result.errors) == 1, result.errors
    error = result.errors[0]
    assert error.kind == kind
    assert fragment in error.message
    # The message shows the expected syntax so the model can correct itself.
    assert "Expected syntax: " + type(parser).syntax in error.message
    assert error.raw
    assert result.meta["errors"] == 1 and result.meta["count"] == 0
    if family not in ("llama4_pythonic", "json_envelope"):
        assert result.text == response.strip()  # the text is kept


def test_good_calls_survive_next_to_a_bad_one() -> None:
    response = (
        '<tool_call>{"name": "a", "arguments": {}}</tool_call>\n'
        '<tool_call>{"name": "b", "arguments": {oops}}</tool_call>\n'
        '<tool_call>{"name": "c", "arguments": {"k": 1}}</tool_call>'
    )
    result = get_parser("hermes")(response)
    assert [c.tool for c in result.calls] == ["a", "c"]
    assert len(result.errors) == 1
    assert result.text == '<tool_call>{"name": "b", "arguments": {oops}}</tool_call>'


GARBAGE = [
    "",
    "   ",
    "<tool_call>",
    "</tool_call>",
    "[TOOL_CALLS]",
    "[",
    "{",
    '{"name": ',
    "<function_calls>",
    "<|tool_calls_section_begin|>",
    DS_BEGIN,
    DS_BEGIN + DS_CALL,
    "<start_function_call>call:f{",
    "```python",
    "[" * 5000,
    "{" * 5000,
    "[f(a=" + "[" * 3000,
    "<|python_start|>[" + "(" * 3000,
    "\x00\ufffd\U0001f600 <tool_call>\x00</tool_call>",
]


@pytest.mark.parametrize("family", sorted(PARSERS))
def test_garbage_never_raises(family: str) -> None:
    parser = get_parser(family)
    for response in GARBAGE:
        result = parser(response)
        assert isinstance(result.text, str)
        for error in result.errors:
            assert error.message.startswith(("Could not parse", "Failed to parse"))


def test_error_flood_is_capped() -> None:
    from toolservices.parsing._common import MAX_ERRORS

    # After MAX_ERRORS the scan stops (bounded work on hostile output) and a
    # last error says so; a good call after the flood is not read.
    good = '<tool_call>[{"name": "f", "arguments": {}}]'
    result = get_parser("granite")("<tool_call>" * 1000 + good)
    assert len(result.errors) == MAX_ERRORS + 1
    assert [e.kind for e in result.errors[MAX_ERRORS:]] == ["too_many_errors"]
    assert "was not read" in result.errors[-1].message
    assert result.meta["scan_stopped"] is True
    assert result.meta["errors"] == MAX_ERRORS + 1
    assert result.calls == []
    assert result.text.endswith(good)  # nothing is cut out of the visible text
