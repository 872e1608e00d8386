"""Gemma 4, DeepSeek-V4, LFM2/LFM2.5 and the Nemotron 3 / Qwen3.5 aliases on real outputs.

The responses are written the way the published chat templates render an
assistant turn (google/gemma-4 and vLLM's ``tool_chat_template_gemma4.jinja``,
the DeepSeek-V4 DSML of vLLM's ``parser/deepseek_v4.py``, LiquidAI's
``LFM2.5`` template and tool-use docs, NVIDIA's Nemotron 3 recipe).
"""
# ruff: noqa: E501  (verbatim model outputs read better unwrapped)

from __future__ import annotations

import time
from collections.abc import Callable
from functools import partial
from typing import Any

import pytest

import toolservices
from toolservices.parsing import ParseResult, ToolCall, get_parser
from toolservices.parsing.gemma import Gemma4Parser
from toolservices.parsing.pythonic import Lfm2Parser
from toolservices.parsing.registry import ALIASES, PARSERS
from toolservices.parsing.xml_families import DeepSeekV4Parser

S = '<|"|>'  # Gemma 4's string delimiter token
D = "｜DSML｜"  # DeepSeek's DSML marker (fullwidth bars)

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string"},
                "days": {"type": "integer"},
                "metric": {"type": "boolean"},
                "ratio": {"type": "number"},
                "tags": {"type": "array"},
            },
        },
    },
}


def _calls(result: ParseResult) -> list[tuple[str, dict[str, Any]]]:
    return [(c.tool, c.args) for c in result.calls]


def _ok(family: str, response: str, **kwargs: Any) -> ParseResult:
    result = get_parser(family, **kwargs)(response)
    assert result.errors == [], result.errors
    return result


# --- gemma4 ---------------------------------------------------------------------------


def test_gemma4_several_calls_of_every_value_type_with_text_around() -> None:
    response = (
        "<|channel>thought\nThe user wants weather for two cities.<channel|>"
        "I'll check both cities.\n"
        f"<|tool_call>call:get_weather{{city:{S}Paris, France{S},days:3,metric:true,ratio:0.75,"
        f"tags:[{S}rain{S},{S}wind{S}]}}<tool_call|>"
        f"<|tool_call>call:get_weather{{city:{S}東京{S},days:1,metric:false,ratio:-2e-3,tags:[]}}<tool_call|>"
        f"<|tool_call>call:search{{filters:{{lang:{S}en{S},max:null,nested:{{deep:[1,[2,3]]}}}},q:{S}a {{b}}: c, d{S}}}<tool_call|>"
        "\nDone."
    )
    result = _ok("gemma4", response)
    assert _calls(result) == [
        (
            "get_weather",
            {
                "city": "Paris, France",
                "days": 3,
                "metric": True,
                "ratio": 0.75,
                "tags": ["rain", "wind"],
            },
        ),
        ("get_weather", {"city": "東京", "days": 1, "metric": False, "ratio": -0.002, "tags": []}),
        (
            "search",
            {
                "filters": {"lang": "en", "max": None, "nested": {"deep": [1, [2, 3]]}},
                "q": "a {b}: c, d",
            },
        ),
    ]
    assert result.text == (
        "<|channel>thought\nThe user wants weather for two cities.<channel|>"
        "I'll check both cities.\n\nDone."
    )
    assert result.meta["format"] == "gemma4"
    assert len({c.id for c in result.calls}) == 3


def test_gemma4_as_vllms_docstring_and_template_write_it() -> None:
    # vllm/tool_parsers/gemma4_tool_parser.py: <|tool_call>call:func_name{key:<|"|>value<|"|>,num:42}<tool_call|>
    result = _ok("gemma4", f"<|tool_call>call:func_name{{key:{S}value{S},num:42}}<tool_call|>")
    assert _calls(result) == [("func_name", {"key": "value", "num": 42})]
    # Keys may come wrapped in the delimiter too (vLLM normalises them), and no-argument calls are {}.
    result = _ok(
        "gemma4",
        f"<|tool_call>call:get_time{{}}<tool_call|><|tool_call>call:set{{{S}key{S}:{S}v{S}}}<tool_call|>",
    )
    assert _calls(result) == [("get_time", {}), ("set", {"key": "v"})]


def test_gemma4_bare_words_and_python_none_are_kept_readable() -> None:
    result = _ok("gemma4", "<|tool_call>call:f{mode:fast,x:None,code:007}<tool_call|>")
    assert _calls(result) == [("f", {"mode": "fast", "x": None, "code": "007"})]


def test_gemma4_complete_call_without_end_token_is_accepted() -> None:
    result = _ok("gemma4", f"Sure.<|tool_call>call:get_weather{{city:{S}Rome{S}}}")
    assert _calls(result) == [("get_weather", {"city": "Rome"})]
    assert result.text == "Sure."


@pytest.mark.parametrize(
    ("response", "kind", "fragment"),
    [
        (f"Checking.<|tool_call>call:get_weather{{city:{S}Par", "truncated", "never closed"),
        ("<|tool_call>call:get_weather{city:", "truncated", "never closed"),
        ("<|tool_call>call:f{a:{b:[1,2", "truncated", "never closed"),
        ("<|tool_call>call:get_wea", "truncated", "cut off"),
        (
            '<|tool_call>{"name": "f", "arguments": {}}<tool_call|>',
            "invalid_syntax",
            "call:TOOL_NAME",
        ),
        ("<|tool_call>call:f{a 1}<tool_call|>", "invalid_syntax", "key:value"),
        (
            "<|tool_call>call:f{a:1<tool_call|>",
            "invalid_syntax",
            "never closed before <tool_call|>",
        ),
        (f"<|tool_call>call:f{{a:{S}x}}<tool_call|>", "invalid_syntax", "never closed before"),
        ("<|tool_call>call:f{a:,b:1}<tool_call|>", "invalid_syntax", "value is missing"),
        ("<|tool_call>call:f{a:1}} extra<tool_call|>", "invalid_syntax", "unexpected text"),
        ("<|tool_call>call:{a:1}<tool_call|>", "invalid_syntax", "not a tool name"),
    ],
)
def test_gemma4_malformed_is_a_parse_error(response: str, kind: str, fragment: str) -> None:
    result = get_parser("gemma4")(response)
    assert result.calls == []
    [error] = result.errors
    assert (error.kind, fragment in error.message) == (kind, True), error
    assert Gemma4Parser.syntax in error.message
    assert result.text == response.strip()


def test_gemma4_good_call_survives_next_to_a_bad_one() -> None:
    response = (
        f"<|tool_call>call:a{{x:1}}<tool_call|><|tool_call>call:b{{x 1}}<tool_call|>"
        f"<|tool_call>call:c{{y:{S}z{S}}}<tool_call|>"
    )
    result = get_parser("gemma4")(response)
    assert _calls(result) == [("a", {"x": 1}), ("c", {"y": "z"})]
    assert len(result.errors) == 1 and result.errors[0].tool == "b"
    assert result.text == "<|tool_call>call:b{x 1}<tool_call|>"


# --- deepseek_v4 ----------------------------------------------------------------------

DSV4_RESPONSE = (
    "<think>\nThe user asks for the weather in Hangzhou.\n</think>\n"
    "I'll look it up.\n\n"
    f"<{D}tool_calls>\n"
    f'<{D}invoke name="get_weather">\n'
    f'<{D}parameter name="city" string="true">杭州</{D}parameter>\n'
    f'<{D}parameter name="days" string="false">5</{D}parameter>\n'
    f'<{D}parameter name="tags" string="false">["rain", {{"wind": null}}]</{D}parameter>\n'
    f"</{D}invoke>\n"
    f'<{D}invoke name="get_time">\n'
    f'<{D}parameter name="tz" string="true">Asia/Shanghai</{D}parameter>\n'
    f"</{D}invoke>\n"
    f"</{D}tool_calls>"
)


def test_deepseek_v4_several_invokes_typed_by_the_string_flag() -> None:
    result = _ok("deepseek_v4", DSV4_RESPONSE)
    assert _calls(result) == [
        ("get_weather", {"city": "杭州", "days": 5, "tags": ["rain", {"wind": None}]}),
        ("get_time", {"tz": "Asia/Shanghai"}),
    ]
    assert result.text == (
        "<think>\nThe user asks for the weather in Hangzhou.\n</think>\nI'll look it up."
    )


def test_deepseek_v4_invoke_with_a_json_body() -> None:
    # SGLang's DeepSeekV4Detector documents this second form.
    response = (
        f'<{D}tool_calls>\n<{D}invoke name="get_favorite_tourist_spot">\n'
        f'{{ "city": "San Francisco", "top": 3 }}\n</{D}invoke>\n</{D}tool_calls>\nAfter.'
    )
    result = _ok("deepseek_v4", response)
    assert _calls(result) == [("get_favorite_tourist_spot", {"city": "San Francisco", "top": 3})]
    assert result.text == "After."


def test_deepseek_v4_without_string_flag_uses_the_schema() -> None:
    response = (
        f'<{D}tool_calls><{D}invoke name="get_weather">'
        f'<{D}parameter name="days">3</{D}parameter><{D}parameter name="metric">true</{D}parameter>'
        f'<{D}parameter name="city">Nice</{D}parameter></{D}invoke></{D}tool_calls>'
    )
    assert _calls(_ok("deepseek_v4", response, tools=[WEATHER])) == [
        ("get_weather", {"days": 3, "metric": True, "city": "Nice"})
    ]
    assert _calls(_ok("deepseek_v4", response)) == [
        ("get_weather", {"days": "3", "metric": "true", "city": "Nice"})
    ]


def test_deepseek_v4_does_not_read_the_v32_wrapper() -> None:
    v32 = f'<{D}function_calls>\n<{D}invoke name="f">\n</{D}invoke>\n</{D}function_calls>'
    result = _ok("deepseek_v4", v32)
    assert result.calls == [] and result.text == v32
    assert _calls(_ok("deepseek_v32", v32)) == [("f", {})]


@pytest.mark.parametrize(
    ("response", "kind", "fragment"),
    [
        (
            f'Ok.\n<{D}tool_calls>\n<{D}invoke name="get_weather">\n<{D}parameter name="city" string="true">Hang',
            "truncated",
            "cut off",
        ),
        (f"<{D}tool_calls>\n", "truncated", "cut off"),
        (
            f'<{D}tool_calls><{D}invoke name="f">{{"a": 1,}}</{D}invoke></{D}tool_calls>',
            "invalid_json",
            "invalid JSON",
        ),
        (
            f'<{D}tool_calls><{D}invoke name="f">{{"a": [1, 2}}</{D}invoke></{D}tool_calls>',
            "invalid_json",
            "invalid JSON",
        ),
        (
            f'<{D}tool_calls><{D}invoke name="f">{{"a": 1</{D}invoke></{D}tool_calls>',
            "invalid_json",
            "brackets",
        ),
        (
            f'<{D}tool_calls><{D}invoke name="f">just some words</{D}invoke></{D}tool_calls>',
            "invalid_syntax",
            "one JSON object",
        ),
        (
            f'<{D}tool_calls><{D}invoke name="">{{}}</{D}invoke></{D}tool_calls>',
            "invalid_syntax",
            "name is missing",
        ),
        (f'<{D}tool_calls>{{"name": "f"}}</{D}tool_calls>', "invalid_syntax", "invoke name="),
    ],
)
def test_deepseek_v4_malformed_is_a_parse_error(response: str, kind: str, fragment: str) -> None:
    result = get_parser("deepseek_v4")(response)
    assert result.calls == []
    [error] = result.errors
    assert (error.kind, fragment in error.message) == (kind, True), error
    assert DeepSeekV4Parser.syntax in error.message
    assert result.text == response.strip()


# --- lfm2 -----------------------------------------------------------------------------


def test_lfm2_docs_example_with_text_after() -> None:
    # docs.liquid.ai "Tool Use" and the LFM2 model cards.
    response = (
        '<|tool_call_start|>[get_candidate_status(candidate_id="12345")]<|tool_call_end|>'
        "Checking the current status of candidate ID 12345."
    )
    result = _ok("lfm2", response)
    assert _calls(result) == [("get_candidate_status", {"candidate_id": "12345"})]
    assert result.text == "Checking the current status of candidate ID 12345."


def test_lfm25_template_rendering_of_several_calls() -> None:
    # LFM2.5's template: strings in single quotes, dicts via tojson, lists and
    # booleans via Python's str(), calls joined with ", " in one list.
    response = (
        "<think>Two lookups are needed.</think>Let me look these up.\n"
        "<|tool_call_start|>[get_weather(city='Paris', days=3, metric=True, tags=['rain', 'wind']), "
        'search(q="l\'été à Paris", filters={"lang": "fr", "free": true, "max": null}, limit=-5, ratio=0.5)]'
        "<|tool_call_end|>"
    )
    result = _ok("lfm2", response)
    assert _calls(result) == [
        ("get_weather", {"city": "Paris", "days": 3, "metric": True, "tags": ["rain", "wind"]}),
        (
            "search",
            {
                "q": "l'été à Paris",
                "filters": {"lang": "fr", "free": True, "max": None},
                "limit": -5,
                "ratio": 0.5,
            },
        ),
    ]
    assert result.text == "<think>Two lookups are needed.</think>Let me look these up."


def test_lfm2_json_mode() -> None:
    # "Output function calls as JSON" in the system prompt (docs.liquid.ai).
    response = (
        '<|tool_call_start|>[{"name": "calculator", "arguments": {"expression": "5 * 7"}}, '
        '{"name": "get_time", "arguments": {}}]<|tool_call_end|>'
    )
    assert _calls(_ok("lfm2", response)) == [
        ("calculator", {"expression": "5 * 7"}),
        ("get_time", {}),
    ]


def test_lfm2_complete_list_without_end_token_is_accepted() -> None:
    result = _ok("lfm2", "Ok.\n<|tool_call_start|>[ping(host='example.org')]")
    assert _calls(result) == [("ping", {"host": "example.org"})]
    assert result.text == "Ok."


@pytest.mark.parametrize(
    ("response", "kind", "fragment"),
    [
        ("<|tool_call_start|>[get_weather(city='Par", "truncated", "never closed"),
        ('<|tool_call_start|>[{"name": "f", "arguments": {"a": ', "truncated", "never closed"),
        (
            "<|tool_call_start|>[get_weather('Paris')]<|tool_call_end|>",
            "invalid_syntax",
            "keyword only",
        ),
        (
            "<|tool_call_start|>[get_weather(city=Paris)]<|tool_call_end|>",
            "invalid_syntax",
            "not a literal",
        ),
        (
            "<|tool_call_start|>[f(a=__import__('os'))]<|tool_call_end|>",
            "invalid_syntax",
            "not a literal",
        ),
        ("<|tool_call_start|>[]<|tool_call_end|>", "invalid_syntax", "empty"),
        ("<|tool_call_start|><|tool_call_end|>", "invalid_syntax", "empty"),
        (
            '<|tool_call_start|>[{"arguments": {}}]<|tool_call_end|>',
            "invalid_syntax",
            'string "name"',
        ),
    ],
)
def test_lfm2_malformed_is_a_parse_error(response: str, kind: str, fragment: str) -> None:
    result = get_parser("lfm2")(response)
    assert result.calls == []
    [error] = result.errors
    assert (error.kind, fragment in error.message) == (kind, True), error
    assert Lfm2Parser.syntax in error.message
    assert result.text == response.strip()


# --- aliases: formats identical to an existing family --------------------------------


def test_nemotron3_and_qwen35_write_the_qwen3_coder_format() -> None:
    response = (
        "<think>\nI need the forecast.\n</think>\n"
        "<tool_call>\n<function=get_weather>\n<parameter=city>\nSan Francisco\n</parameter>\n"
        "<parameter=days>\n2\n</parameter>\n<parameter=metric>\nfalse\n</parameter>\n</function>\n"
        "</tool_call>\n<tool_call>\n<function=get_weather>\n<parameter=city>\nOslo\n</parameter>\n"
        "</function>\n</tool_call>"
    )
    for name in ("nemotron_v3", "nemotron3", "qwen3_5", "qwen3_6", "Qwen3-5"):
        parser = get_parser(name, tools=[WEATHER])
        assert parser.name == "qwen3_coder"
        result = parser(response)
        assert result.errors == []
        assert _calls(result) == [
            ("get_weather", {"city": "San Francisco", "days": 2, "metric": False}),
            ("get_weather", {"city": "Oslo"}),
        ]
        assert result.text == "<think>\nI need the forecast.\n</think>"


@pytest.mark.parametrize(
    ("alias", "family"),
    [("deepseekv4", "deepseek_v4"), ("lfm2_5", "lfm2"), ("LFM2-5", "lfm2"), ("Gemma4", "gemma4")],
)
def test_new_aliases(alias: str, family: str) -> None:
    assert get_parser(alias).name == family


def test_new_names_are_registered_and_listed() -> None:
    assert {"gemma4", "deepseek_v4", "lfm2"} <= set(PARSERS)
    assert set(ALIASES.values()) <= set(PARSERS)
    names = toolservices.available_parsers()
    for name in ("gemma4", "deepseek_v4", "lfm2", "nemotron_v3", "qwen3_5", "lfm2_5"):
        assert name in names


def test_available_parsers_is_exported_at_the_top_level() -> None:
    from toolservices import available_parsers
    from toolservices import get_parser as top_get_parser
    from toolservices.parsing import available_parsers as parsing_available_parsers

    assert available_parsers is parsing_available_parsers
    assert "available_parsers" in toolservices.__all__
    assert available_parsers() == sorted(available_parsers())
    for name in available_parsers():
        assert top_get_parser(name).name in PARSERS


# --- size: one pass over the input ----------------------------------------------------

ROUND_TRIP_CALLS = [
    ToolCall("get_weather", {"city": "Paris, France", "days": 3, "metric": True}),
    ToolCall("search", {"q": "naïve {café}", "filters": {"lang": ["en", "fr"]}, "limit": None}),
]


@pytest.mark.parametrize("family", ["gemma4", "deepseek_v4", "lfm2"])
def test_thousands_of_calls_in_one_response(family: str) -> None:
    parser = get_parser(family)
    one = parser.render(ROUND_TRIP_CALLS)
    result = parser("Start.\n" + "\n".join([one] * 2000) + "\nEnd.")
    assert result.errors == []
    assert len(result.calls) == 4000
    assert result.text == "Start.\n\nEnd." or result.text.startswith("Start.")


def _cpu_seconds(fn: Callable[[], Any]) -> float:
    best = float("inf")
    for _ in range(3):
        start = time.process_time()
        fn()
        best = min(best, time.process_time() - start)
    return best


HOSTILE_UNITS: dict[str, list[str]] = {
    "gemma4": [
        f"<|tool_call>call:f{{a:{S}x}}<tool_call|>",
        "<|tool_call>call:f{a:[{b:<tool_call|>",
        "<|tool_call>call:f{a:1}<tool_call|>",
        f"<|tool_call>call:f{{a:{S}",
    ],
    "deepseek_v4": [
        f'<{D}tool_calls><{D}invoke name="f">{{"a":</{D}invoke></{D}tool_calls>',
        f'<{D}tool_calls><{D}invoke name="f"><{D}parameter name="a" string="true">',
        f'<{D}invoke name="',
    ],
    "lfm2": [
        "<|tool_call_start|>[f(a='x)]<|tool_call_end|>",
        "<|tool_call_start|>[f(a=1)]<|tool_call_end|>",
        "<|tool_call_start|>[f(a='",
    ],
}


@pytest.mark.timeout(120)
@pytest.mark.parametrize("family", sorted(HOSTILE_UNITS))
def test_hostile_input_grows_linearly(family: str) -> None:
    """10x the input costs about 10x the time: a coarse ratio (a quadratic scan gives ~100x)."""
    parser = get_parser(family)
    for unit in HOSTILE_UNITS[family]:
        small, large = unit * 2000, unit * 20000
        assert isinstance(parser(large).text, str)
        ratio = _cpu_seconds(partial(parser, large)) / max(
            _cpu_seconds(partial(parser, small)), 1e-3
        )
        assert ratio < 40, (unit, ratio)
