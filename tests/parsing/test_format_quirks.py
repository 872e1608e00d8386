"""What real models and tool specs write outside the textbook syntax (issues 10 and 12)."""

from __future__ import annotations

import json
from types import ModuleType
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from toolservices.parsing import ParseResult, get_parser


def _calls(result: ParseResult) -> list[tuple[str, dict[str, Any]]]:
    return [(c.tool, c.args) for c in result.calls]


# --- Qwen3-Coder without the <tool_call> wrapper -----------------------------------

FUNCTION = "<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n</function>"
WEATHER = ("get_weather", {"city": "Paris"})


@pytest.mark.parametrize(
    ("response", "calls", "text"),
    [
        (f"Let me check.\n{FUNCTION}", [WEATHER], "Let me check."),
        (f"Let me check.\n{FUNCTION}\n</tool_call>", [WEATHER], "Let me check."),
        (f"{FUNCTION}</tool_call>\nDone.", [WEATHER], "Done."),
        (
            f"{FUNCTION}\n<function=get_time>\n<parameter=tz>\nUTC\n</parameter>\n</function>",
            [WEATHER, ("get_time", {"tz": "UTC"})],
            "",
        ),
        (
            f"<tool_call>\n{FUNCTION}\n</tool_call>\nand\n{FUNCTION}\n</tool_call>",
            [WEATHER, WEATHER],
            "and",
        ),
        # a missing </function> before the next function is tolerated, as in blocks
        (
            "<function=a>\n<parameter=x>\n1\n</parameter>\n<function=b>\n</function>",
            [("a", {"x": "1"}), ("b", {})],
            "",
        ),
    ],
)
def test_qwen3_coder_reads_functions_without_the_wrapper(
    response: str, calls: list[Any], text: str
) -> None:
    for family in ("qwen3_coder", "qwen3_xml"):
        result = get_parser(family)(response)
        assert result.errors == []
        assert _calls(result) == calls
        assert result.text == text


def test_qwen3_coder_unwrapped_call_cut_off_is_truncated() -> None:
    result = get_parser("qwen3_coder")("Checking.\n<function=get_weather>\n<parameter=city>\nPa")
    assert result.calls == []
    [error] = result.errors
    assert error.kind == "truncated" and error.tool == "get_weather"
    assert result.text.startswith("Checking.\n<function=get_weather>")


def test_qwen3_coder_unwrapped_values_are_schema_typed() -> None:
    spec = {"name": "f", "parameters": {"properties": {"n": {"type": "integer"}}}}
    result = get_parser("qwen3_coder", tools=[spec])(
        "<function=f><parameter=n>5</parameter></function>"
    )
    assert _calls(result) == [("f", {"n": 5})]


# --- "type": "float" and other non-JSON-Schema type names --------------------------

SPEC = {
    "name": "f",
    "parameters": {
        "type": "object",
        "properties": {
            "x": {"type": "float"},
            "y": {"type": "double"},
            "n": {"type": "int"},
            "b": {"type": "bool"},
            "d": {"type": "dict"},
            "l": {"type": "list"},
            "s": {"type": "str"},
            "o": {"type": ["Float", "null"]},
            "u": {"anyOf": [{"type": "float"}, {"type": "none"}]},
        },
    },
}
RAW = {
    "x": "2.5",
    "y": "-1e3",
    "n": "7",
    "b": "true",
    "d": '{"k": 1}',
    "l": "[1, 2]",
    "s": "5",
    "o": "0.5",
    "u": "null",
}
TYPED = {
    "x": 2.5,
    "y": -1000.0,
    "n": 7,
    "b": True,
    "d": {"k": 1},
    "l": [1, 2],
    "s": "5",
    "o": 0.5,
    "u": None,
}


@pytest.mark.parametrize("family", ["qwen3_coder", "seed_oss", "minimax_m2", "step3", "glm45"])
def test_float_and_other_type_aliases_convert_raw_values(family: str) -> None:
    from toolservices.parsing import ToolCall

    parser = get_parser(family, tools=[SPEC])
    rendered = parser.render([ToolCall("f", RAW)])  # raw text values, as a model writes them
    result = parser(rendered)
    assert result.errors == []
    assert _calls(result) == [("f", TYPED)]


def test_type_aliases_leave_standard_schemas_alone() -> None:
    from toolservices.parsing._schema import normalise_types

    schema = {"type": "number", "anyOf": [{"type": "integer"}]}
    assert normalise_types(schema) is schema
    assert normalise_types({"type": "Custom"}) == {"type": "Custom"}


# --- Mistral before v11 with junk after [TOOL_CALLS] --------------------------------

ARRAY = '[{"name": "get_weather", "arguments": {"city": "Paris"}}]'


@pytest.mark.parametrize(
    ("response", "text"),
    [
        (f"[TOOL_CALLS] Here are the calls: {ARRAY}", ""),
        (f"[TOOL_CALLS]calls{ARRAY}", ""),
        (f"[TOOL_CALLS]\n```json\n{ARRAY}\n```\nDone.", "Done."),
        (f"Sure.\n[TOOL_CALLS] json {ARRAY}", "Sure."),
    ],
)
def test_mistral_array_after_junk_is_read(response: str, text: str) -> None:
    result = get_parser("mistral")(response)
    assert result.errors == []
    assert _calls(result) == [WEATHER]
    assert result.text == text


@pytest.mark.parametrize("junk", ["hello there", "Here are my calls:", "```json", "... {"])
def test_mistral_junk_is_never_a_tool_name(junk: str) -> None:
    result = get_parser("mistral")(f"[TOOL_CALLS] {junk}")
    assert result.calls == []
    [error] = result.errors
    first_word = junk.split()[0]
    assert f"tool name {first_word!r}" not in error.message
    assert error.tool is None
    assert "TOOL_NAME{json arguments}" in error.message


def test_mistral_v11_forms_are_unchanged() -> None:
    parser = get_parser("mistral")
    for response in (
        '[TOOL_CALLS]get_weather{"city": "Paris"}',
        '[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}',
        '[TOOL_CALLS] get_weather {"city": "Paris"}',
        '[TOOL_CALLS]get_weather[CALL_ID]abc123[ARGS]{"city": "Paris"}',
    ):
        result = parser(response)
        assert _calls(result) == [WEATHER] and result.errors == []


# --- xml_block: a superset of TorchRL's XMLBlockParser ------------------------------

_NAME = st.text(st.sampled_from("abcxyz_.-/ 19"), min_size=1, max_size=8).filter(str.strip)
_TAG = st.none() | _NAME
_JSON_VALUE = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=6),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner),
    max_leaves=6,
)
_BODY = (
    st.dictionaries(st.text(max_size=5), _JSON_VALUE, max_size=3).map(json.dumps)
    | st.sampled_from(["", "  \n ", "bad json", "{oops}", "{'a': 1}", '{"a": 1} junk'])
).flatmap(lambda body: st.sampled_from([body, f"  {body}\n", f"\n{body}"]))
_PROSE = st.text(st.sampled_from("ab <>=\"'\n.{}"), max_size=12).filter(
    lambda s: "<tool" not in s and "</tool" not in s
)


@st.composite
def _block(draw: Any) -> tuple[str, bool, tuple[str, Any, str | None]]:
    """One closed block: (source, TorchRL reads it, the call we expect)."""
    name, tag, body = draw(_NAME), draw(_TAG), draw(_BODY)
    space = draw(st.sampled_from([" ", "  ", "\n"]))
    before = draw(st.sampled_from(["", " ", "\n"]))
    # TorchRL's own form: name first, optional non-empty tag second.
    attrs = [f'name="{name}"'] + ([f'tag="{tag}"'] if tag else [])
    torchrl_form = True
    variant = draw(st.sampled_from(["plain", "reordered", "empty_tag", "spaced"]))
    if variant == "reordered" and tag:
        attrs.reverse()
        torchrl_form = False
    elif variant == "empty_tag" and not tag:
        attrs.append('tag=""')
        torchrl_form = False
    elif variant == "spaced":
        attrs = [a.replace("=", " = ") for a in attrs]
        torchrl_form = False
    source = f"<tool{space}{space.join(attrs)}{before}>{body}</tool>"
    stripped = body.strip()
    try:
        args = json.loads(stripped) if stripped else {}
    except json.JSONDecodeError:
        args = {"raw": stripped}
    return source, torchrl_form, (name, args, tag or None)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(_PROSE, _block()), max_size=4), _PROSE)
def test_xml_block_accepts_everything_torchrl_accepts(
    torchrl_tools: ModuleType,
    pieces: list[tuple[str, tuple[str, bool, tuple[str, Any, str | None]]]],
    tail: str,
) -> None:
    response = "".join(prose + block[0] for prose, block in pieces) + tail
    ours = get_parser("xml_block")(response)
    theirs = torchrl_tools.XMLBlockParser()(response)
    as_tuples = [(c.tool, c.args, c.tag) for c in ours.calls]
    expected = [block[2] for _, block in pieces]
    assert as_tuples == expected  # every block, in TorchRL's form or not
    assert ours.errors == []
    torchrl_calls = [(c.tool, c.args, c.tag) for c in theirs["calls"]]
    assert torchrl_calls == [block[2] for _, block in pieces if block[1]]
    if all(block[1] for _, block in pieces):
        assert ours.text == theirs["text"]


def test_xml_block_superset_forms() -> None:
    parser = get_parser("xml_block")
    result = parser('a <tool tag="T" name="x">{"k": 1}</tool> b <tool name="y" tag="">{}</tool>')
    assert [(c.tool, c.args, c.tag) for c in result.calls] == [
        ("x", {"k": 1}, "T"),
        ("y", {}, None),
    ]
    assert result.text == "a  b"
    for bad, fragment in (
        ('<tool name="">{}</tool>', 'non-empty name="TOOL_NAME"'),
        ('<tool tag="t">{}</tool>', 'non-empty name="TOOL_NAME"'),
        ('<tool name="x" id="1">{}</tool>', "unknown <tool> attribute 'id'"),
    ):
        result = parser(bad)
        assert result.calls == [] and result.text == bad
        [error] = result.errors
        assert fragment in error.message and error.kind == "invalid_syntax"
