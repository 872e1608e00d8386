"""The contract parsers against TorchRL 0.14.1, run side by side on the same inputs."""

from __future__ import annotations

import json
from types import ModuleType
from typing import Any

import pytest

from toolservices.parsing import (
    JSONCallParser,
    PythonBlockParser,
    RegexParser,
    SimpleToolParser,
    ToolCall,
    XMLBlockParser,
    get_parser,
)

XML_INPUTS: list[Any] = [
    'hi <tool name="add" tag="A">{"a": 1, "b": 2}</tool> bye',
    'Let me search.\n<tool name="search">{"query": "naïve 東京"}</tool>',
    '<tool name="x">bad json</tool>',
    '<tool name="x"></tool>',
    '<tool name="x">   \n </tool>',
    "<tool name='x'>{}</tool>",
    '<tool  name="x" >{}</tool>',
    '<tool\nname="x"\n>{}</tool>',
    '<tool name="x" foo="b">{}</tool>',
    'a<tool name="x">{"q": 1}</tool>b<tool name="y" tag="T2">{"b": {"c": [1, 2]}}</tool>c',
    'a\n<tool name="x">{}</tool>\nb',
    '<tool name="x">{"a": 1} junk</tool>',
    '<tool name="x">{"a":"</tool>"}</tool>',
    '<tool name="">{}</tool>',
    '<tool name="a b">{}</tool>',
    '<TOOL name="x">{}</TOOL>',
    "  plain text  ",
    "",
    {"text": '<tool name="x">{"k": "v"}</tool> done'},
    '<tool name="x">{"a": 1}',  # unterminated: kept as text
    '<tool name="m">{"nested": {"deep": [{"x": null}, true, 1.5e3]}}</tool>',
]


def _as_tuples(calls: list[Any]) -> list[tuple[Any, Any, Any]]:
    return [(c.tool, c.args, c.tag) for c in calls]


@pytest.mark.parametrize("response", XML_INPUTS)
def test_xml_block_matches_torchrl(response: Any, torchrl_tools: ModuleType) -> None:
    ours = XMLBlockParser()(response)
    theirs = torchrl_tools.XMLBlockParser()(response)
    assert ours["text"] == theirs["text"]
    assert _as_tuples(ours["calls"]) == _as_tuples(theirs["calls"])
    assert ours["meta"]["count"] == theirs["meta"]["count"]


@pytest.mark.parametrize(
    ("body", "torchrl_args"),
    [("[1, 2]", [1, 2]), ("5", 5), ('"plain"', "plain"), ("null", None)],
)
def test_xml_block_non_object_json_is_fixed(
    body: str, torchrl_args: Any, torchrl_tools: ModuleType
) -> None:
    """TorchRL passes non-object JSON as ``args`` (the call then crashes); we keep an object."""
    response = f'<tool name="x">{body}</tool>'
    assert torchrl_tools.XMLBlockParser()(response)["calls"][0].args == torchrl_args
    ours = XMLBlockParser()(response)["calls"][0].args
    assert ours == ({} if body == "null" else {"raw": body})


def test_xml_block_unterminated_is_a_parse_error_and_keeps_text() -> None:
    result = XMLBlockParser()('Sure.\n<tool name="calc" tag="t">{"expr": "1+')
    assert result.calls == []
    assert result.text == 'Sure.\n<tool name="calc" tag="t">{"expr": "1+'
    [error] = result.errors
    assert error.kind == "truncated" and error.tool == "calc"
    assert "</tool>" in error.message and '<tool name="TOOL_NAME"' in error.message


def test_xml_block_json_string_holding_json_is_decoded_once() -> None:
    inner = json.dumps({"a": 1})
    result = XMLBlockParser()(f'<tool name="x">{json.dumps(inner)}</tool>')
    assert result.calls[0].args == {"a": 1}


JSON_INPUTS: list[Any] = [
    '{"message": "hi", "tools": [{"tool": "a", "args": {"x": 1}, "tag": "T"}]}',
    '{"message": "two", "tools": [{"tool": "a", "args": {}}, {"tool": "b", "args": {"y": [1]}}]}',
    "not json",
    "  not json  ",
    '{"message": "  padded  "}',
    '{"message": "m"}',
    '{"message": "m", "tools": []}',
    '  {"message": "hi", "tools": []}  ',
    '{"message": "hi"} trailing',
    '{"a": 1}',
    "",
    {"message": "hi", "tools": [{"tool": "a", "args": {"x": 1}}]},
    {"tools": [{"tool": "a", "args": {}}]},
    {"message": "x", "tools": [{"tool": "a", "args": {}, "tag": None}]},
    {},
    '{"message": "ünïcödé ✓", "tools": [{"tool": "t", "args": {"s": "東京"}}]}',
]


@pytest.mark.parametrize("response", JSON_INPUTS)
def test_json_envelope_matches_torchrl(response: Any, torchrl_tools: ModuleType) -> None:
    ours = JSONCallParser()(response)
    theirs = torchrl_tools.JSONCallParser()(response)
    assert ours["text"] == theirs["text"]
    assert _as_tuples(ours["calls"]) == _as_tuples(theirs["calls"])
    assert ours["meta"]["count"] == theirs["meta"]["count"]
    assert ours.errors == []


@pytest.mark.parametrize(
    ("response", "expected_text", "fragment"),
    [
        ('{"message": "hi", "tools": null}', "hi", None),
        ('{"message": "hi", "tools": {"tool": "a"}}', "hi", '"tools" must be a list'),
        ('{"message": "hi", "tools": [5]}', "hi", "must be an object"),
        ('{"message": "hi", "tools": [{"args": {}}]}', "hi", 'needs a string "tool"'),
        ('{"message": "hi", "tools": [{"tool": "a", "args": "x"}]}', "hi", "JSON object"),
        ("[1, 2]", "[1, 2]", None),
        ("null", "null", None),
        ('{"message": "hi", "tools": [{"tool": "a", "args": {', None, "truncated"),
    ],
)
def test_json_envelope_where_torchrl_crashes(
    response: str, expected_text: str | None, fragment: str | None
) -> None:
    """TorchRL raises on these; we return text and (where useful) a parse error."""
    result = JSONCallParser()(response)
    assert result.text == (response if expected_text is None else expected_text)
    assert result.calls == []
    if fragment is None:
        assert result.errors == []
    else:
        [error] = result.errors
        assert fragment in error.message
        assert '"tools": [{"tool": "TOOL_NAME"' in error.message


def test_json_envelope_extra_keys_and_missing_args() -> None:
    result = JSONCallParser()('{"message": "", "tools": [{"tool": "a", "extra": 1}]}')
    assert _as_tuples(result.calls) == [("a", {}, None)]


def test_json_envelope_reads_chat_message_dicts() -> None:
    message = {"role": "assistant", "content": '{"message": "m", "tools": [{"tool": "a"}]}'}
    result = JSONCallParser()(message)
    assert result.text == "m" and [c.tool for c in result.calls] == ["a"]


@pytest.mark.parametrize(
    "response",
    [
        "a\n```python\nprint(1)\n```\nb",
        "```python\nx = 1\n```\ntext\n```python\ny = 2\nprint(x + y)\n```",
        "```python\n\n```",
        "no code here",
        "```python\nprint(1)",  # unterminated
    ],
)
def test_python_block_finds_the_blocks_torchrl_runs(
    response: str, torchrl_tools: ModuleType
) -> None:
    interpreter = torchrl_tools.PythonInterpreter()
    try:
        expected = interpreter._extract_python_code(response)
    finally:
        interpreter.close()
    calls = PythonBlockParser()(response).calls
    assert [c.args["code"] for c in calls] == expected
    assert all(c.tool == "python" for c in calls)


def test_python_block_text_keeps_prose_and_accepts_py() -> None:
    result = PythonBlockParser()("Compute it:\n```py\nprint(2 ** 10)\n```\nThen report.")
    assert result.text == "Compute it:\n\nThen report."
    assert result.calls == [
        ToolCall(
            "python",
            {"code": "print(2 ** 10)"},
            id=result.calls[0].id,
            raw="```py\nprint(2 ** 10)\n```",
        )
    ]


def test_python_block_unterminated_is_truncated_error() -> None:
    result = PythonBlockParser()("Let me run:\n```python\nfor i in range(")
    assert result.calls == [] and result.errors[0].kind == "truncated"
    assert result.text.startswith("Let me run:")


SIMPLE_INPUTS = [
    'hi <tool>add\n{"a": 1, "b": 2}</tool> bye',
    "<tool>add\n{bad}</tool>",
    "<tool>add\n</tool>",
    "<tool>add\n[1]</tool>",
    '<tool>mcp.time\n{"timezone": "Europe/Paris"}</tool>\n<tool>add\n{"a": 1, "b": 2}</tool>',
    "<tool>add\nline1\nline2</tool>",
]


@pytest.mark.parametrize("response", SIMPLE_INPUTS)
def test_simple_tool_matches_torchrl_extraction(response: str, torchrl_tools: ModuleType) -> None:
    transform = torchrl_tools.SimpleToolTransform(tools={"add": lambda a, b: a + b})
    extracted = transform._extract_tool_calls(response)
    result = SimpleToolParser()(response)
    found = [(c.tool, c.args) for c in result.calls] + [(e.tool, None) for e in result.errors]
    assert sorted(name for name, _ in found) == sorted(name for name, _ in extracted)
    for name, args_json in extracted:
        outcome = transform._execute_tool(name, args_json)
        bad_json = not outcome["success"] and outcome["error"].startswith(
            "Failed to parse tool arguments: "
        )
        if bad_json:
            [error] = [e for e in result.errors if e.tool == name]
            # Same prefix and same JSON diagnosis as TorchRL, plus the expected syntax.
            assert error.message.startswith(outcome["error"])
            assert "<tool>TOOL_NAME" in error.message


def test_simple_tool_non_object_arguments_and_missing_newline() -> None:
    result = SimpleToolParser()('<tool>add\n[1]</tool> and <tool>add {"a": 1}</tool>')
    assert result.calls == []
    first, second = result.errors
    assert first.message.startswith(
        "Failed to parse tool arguments: arguments must be a JSON object"
    )
    assert "first line" in second.message


def test_simple_tool_strips_the_name_and_reports_truncation() -> None:
    result = SimpleToolParser()('<tool> add \n{"a": 1, "b": 2}\n</tool>\n<tool>add\n{"a": ')
    assert [(c.tool, c.args) for c in result.calls] == [("add", {"a": 1, "b": 2})]
    assert result.errors[0].kind == "truncated"


def test_regex_parser_with_torchrl_style_pattern() -> None:
    parser = RegexParser(r"<call>(.*?)\|(.*?)</call>", template="<call>{name}|{args}</call>")
    result = parser('x <call>add|{"a": 1}</call> y <call>bad|{nope}</call>')
    assert [(c.tool, c.args) for c in result.calls] == [("add", {"a": 1})]
    assert result.text == "x  y <call>bad|{nope}</call>"
    assert result.errors[0].message.startswith("Failed to parse tool arguments: ")
    calls = [ToolCall("f", {"k": "v"})]
    assert [(c.tool, c.args) for c in parser(parser.render(calls)).calls] == [("f", {"k": "v"})]


def test_regex_parser_named_groups_and_bad_patterns() -> None:
    parser = RegexParser(r"CALL (?P<args>\{.*?\}) ON (?P<name>\w+)")
    assert parser('CALL {"a": 1} ON f').calls[0].tool == "f"
    with pytest.raises(ValueError, match="two groups"):
        RegexParser(r"<x>(.*)</x>")
    with pytest.raises(ValueError, match="template"):
        parser.render([ToolCall("f", {})])


def test_contract_parsers_by_name() -> None:
    assert isinstance(get_parser("xml_block"), XMLBlockParser)
    assert isinstance(get_parser("json_envelope"), JSONCallParser)
    assert isinstance(get_parser("simple_tool"), SimpleToolParser)
    assert isinstance(get_parser("python_block"), PythonBlockParser)
