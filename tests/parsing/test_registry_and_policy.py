"""get_parser names and errors, the shared JSON-decoding policy, the result mapping."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

import toolservices.parsing as parsing
from toolservices.errors import UserError
from toolservices.parsing import (
    HermesParser,
    LLMToolParser,
    MistralParser,
    ParseResult,
    Qwen3CoderParser,
    ToolCall,
    available_parsers,
    get_parser,
)
from toolservices.parsing._json import ArgumentsError, call_from_object, decode_arguments
from toolservices.parsing.registry import ALIASES, PARSERS

REQUIRED = [
    "xml_block",
    "json_envelope",
    "hermes",
    "llama3_json",
    "mistral",
    "pythonic",
    "qwen3_coder",
    "deepseek_v3",
    "python_block",
    "simple_tool",
]


@pytest.mark.parametrize("name", REQUIRED)
def test_required_families_exist(name: str) -> None:
    parser = get_parser(name)
    assert parser.name == name
    assert isinstance(parser, LLMToolParser)


@pytest.mark.parametrize(
    ("alias", "family"),
    [
        ("qwen3_json", "hermes"),
        ("llama4_json", "llama3_json"),
        ("qwen3_xml", "qwen3_coder"),
        ("glm47", "glm45"),
        ("Hermes", "hermes"),
        ("granite_20b_fc", "granite-20b-fc"),
        ("llama3-json", "llama3_json"),
    ],
)
def test_aliases(alias: str, family: str) -> None:
    assert get_parser(alias).name == family


def test_every_formats_md_row_is_served() -> None:
    rows = {
        "hermes", "llama3_json", "pythonic", "llama4_pythonic", "olmo3", "mistral",
        "qwen3_coder", "deepseek_v3", "deepseek_v31", "deepseek_v32", "granite",
        "granite-20b-fc", "internlm", "jamba", "kimi_k2", "glm45", "hunyuan_a13b",
        "minimax", "minimax_m2", "openai", "xlam", "phi4_mini_json", "step3", "seed_oss",
        "longcat", "gigachat3", "ernie45", "functiongemma", "xml_block", "json_envelope",
    }  # fmt: skip
    assert rows <= set(PARSERS)
    assert set(ALIASES.values()) <= set(PARSERS)


def test_unknown_name_lists_the_valid_ones() -> None:
    with pytest.raises(UserError) as info:
        get_parser("hermes2")
    message = str(info.value)
    assert "hermes2" in message
    for name in ("hermes", "qwen3_coder", "qwen3_json", "xml_block"):
        assert name in message
    assert isinstance(info.value, ValueError)
    with pytest.raises(UserError, match="parser name or a ToolParser"):
        get_parser(42)  # type: ignore[arg-type]


def test_instances_pass_through_and_tools_reach_the_parser() -> None:
    parser = MistralParser(variant="pre_v11")
    assert get_parser(parser) is parser
    spec = {"name": "f", "parameters": {"properties": {"n": {"type": "integer"}}}}
    typed = get_parser("qwen3_coder", tools=[spec])
    assert isinstance(typed, Qwen3CoderParser)
    assert typed.schemas.coerce("f", "n", "7") == 7
    with pytest.raises(UserError, match="variant"):
        MistralParser(variant="v7")  # type: ignore[arg-type]


def test_public_api() -> None:
    assert parsing.get_parser is get_parser
    assert set(REQUIRED) <= set(available_parsers())
    for name in parsing.__all__:
        assert hasattr(parsing, name)


def test_parse_result_is_the_contract_mapping() -> None:
    result = HermesParser()('Hi <tool_call>{"name": "f", "arguments": {"a": 1}}</tool_call>')
    assert isinstance(result, ParseResult)
    assert dict(result) == {
        "text": "Hi",
        "calls": result.calls,
        "meta": {"count": 1, "errors": 0, "format": "hermes"},
        "errors": [],
    }
    assert result.ok
    assert re.fullmatch(r"call_[0-9a-f]{12}", result.calls[0].id)
    assert result.calls[0].raw == '<tool_call>{"name": "f", "arguments": {"a": 1}}</tool_call>'
    assert result.calls[0].name == "f"


def test_ids_are_stable_and_distinct_for_identical_calls() -> None:
    response = '<tool_call>{"name": "f", "arguments": {}}</tool_call>' * 2
    first, second = HermesParser()(response).calls
    assert first.id != second.id
    assert [c.id for c in HermesParser()(response).calls] == [first.id, second.id]


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ({"a": 1}, {"a": 1}),
        (None, {}),
        ("", {}),
        ("   ", {}),
        ('{"a": {"b": [1, 2]}}', {"a": {"b": [1, 2]}}),
        ("null", {}),
    ],
)
def test_decode_policy_accepts(value: Any, expected: dict[str, Any]) -> None:
    assert decode_arguments(value) == expected


@pytest.mark.parametrize(
    ("value", "fragment"),
    [
        ("hello", "got a string 'hello'"),
        ([1, 2], "got a list"),
        (5, "got a number"),
        ('"{\\"a\\": 1}"', "got a string"),  # decoded once only: a string holding a string
        ('{"a": ', "brackets and quotes"),
        ('{"a" 1}', "invalid JSON"),
    ],
)
def test_decode_policy_rejects(value: Any, fragment: str) -> None:
    with pytest.raises(ArgumentsError, match=re.escape(fragment)):
        decode_arguments(value)


def test_call_objects() -> None:
    openai_style = {
        "id": "call_1",
        "type": "function",
        "function": {"name": "f", "arguments": json.dumps({"x": 1})},
    }
    assert call_from_object(openai_style) == ("f", {"x": 1}, "call_1")
    assert call_from_object({"name": " g ", "parameters": {"y": 2}}) == ("g", {"y": 2}, "")
    with pytest.raises(ArgumentsError, match='string "name"'):
        call_from_object({"name": 3})
    with pytest.raises(ArgumentsError, match="must be a JSON object"):
        call_from_object([1])


def test_toolcall_keeps_torchrl_positional_order() -> None:
    call = ToolCall("add", {"a": 1}, "T")
    assert (call.tool, call.args, call.tag, call.id, call.raw) == ("add", {"a": 1}, "T", "", None)


def test_messages_with_structured_tool_calls_are_read_as_is() -> None:
    message = {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "call_abc",
                "type": "function",
                "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
            },
            {"id": "call_def", "type": "function", "function": {"name": "f", "arguments": "{"}},
        ],
    }
    for family in ("hermes", "qwen3_coder", "json_envelope"):
        result = get_parser(family)(message)
        assert [(c.tool, c.args, c.id) for c in result.calls] == [
            ("get_weather", {"city": "Paris"}, "call_abc")
        ]
        assert result.text == ""
        [error] = result.errors
        assert error.kind == "truncated" and "'f'" in error.message


def test_odd_tool_calls_fields() -> None:
    parser = get_parser("hermes")
    text = '<tool_call>{"name": "g", "arguments": {}}</tool_call>'
    # An empty list means "no structured calls": the content is parsed as usual.
    result = parser({"role": "assistant", "content": text, "tool_calls": []})
    assert [c.tool for c in result.calls] == ["g"]
    single = {"id": "c1", "function": {"name": "h", "arguments": {"k": 1}}}
    result = parser({"role": "assistant", "content": "", "tool_calls": single})
    assert [(c.tool, c.args, c.id) for c in result.calls] == [("h", {"k": 1}, "c1")]
    result = parser({"role": "assistant", "tool_calls": "garbage"})
    assert result.calls == [] and result.errors[0].kind == "invalid_syntax"
