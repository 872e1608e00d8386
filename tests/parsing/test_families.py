"""Every family on realistic model outputs: prose, several calls, unicode, nested arguments."""
# ruff: noqa: E501  (tables of verbatim model outputs read better unwrapped)

from __future__ import annotations

from typing import Any

import pytest

from toolservices.parsing import ParseResult, get_parser
from toolservices.parsing.registry import PARSERS

WEATHER_SPEC = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather forecast.",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string"},
                "days": {"type": "integer"},
                "metric": {"type": "boolean"},
                "ratio": {"type": "number"},
                "options": {"type": "object"},
                "tags": {"type": "array"},
            },
            "required": ["city"],
        },
    },
}

DS = {  # DeepSeek special tokens: fullwidth bars and U+2581
    "begin": "<｜tool▁calls▁begin｜>",
    "end": "<｜tool▁calls▁end｜>",
    "call": "<｜tool▁call▁begin｜>",
    "call_end": "<｜tool▁call▁end｜>",
    "sep": "<｜tool▁sep｜>",
}
DSML = "｜DSML｜"

Calls = list[tuple[str, dict[str, Any]]]

# (family, response, expected calls, expected visible text)
CASES: list[tuple[str, str, Calls, str]] = [
    (
        "hermes",
        "<think>\nThe user wants the weather in two cities.\n</think>\n\n"
        "I'll look both up.\n<tool_call>\n"
        '{"name": "get_weather", "arguments": {"city": "Paris", "days": 3}}\n</tool_call>\n'
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "東京"}}\n</tool_call>',
        [("get_weather", {"city": "Paris", "days": 3}), ("get_weather", {"city": "東京"})],
        "<think>\nThe user wants the weather in two cities.\n</think>\n\nI'll look both up.",
    ),
    (
        "hermes",  # back to back, no newlines, arguments as a JSON string holding JSON
        '<tool_call>{"name": "a", "arguments": "{\\"x\\": {\\"y\\": [1, 2]}}"}</tool_call>'
        '<tool_call>{"name": "b", "arguments": {}}</tool_call>',
        [("a", {"x": {"y": [1, 2]}}), ("b", {})],
        "",
    ),
    (
        "qwen3_json",  # unterminated last block with complete JSON: accepted (vLLM does too)
        'Checking.\n<tool_call>\n{"name": "search", "arguments": {"q": "naïve"}}',
        [("search", {"q": "naïve"})],
        "Checking.",
    ),
    (
        "llama3_json",
        '{"name": "get_weather", "parameters": {"city": "San Francisco", "days": 2}}',
        [("get_weather", {"city": "San Francisco", "days": 2})],
        "",
    ),
    (
        "llama3_json",
        '<|python_tag|>{"name": "a", "parameters": {"k": 1}}; {"name": "b", "arguments": {}}',
        [("a", {"k": 1}), ("b", {})],
        "",
    ),
    (
        "llama4_json",
        'Here you go: {"name": "lookup", "parameters": {"q": {"nested": true}}}\n'
        'A config like {"debug": true} is not a call.',
        [("lookup", {"q": {"nested": True}})],
        'Here you go: \nA config like {"debug": true} is not a call.',
    ),
    (
        "mistral",  # pre-v11 (Mistral-7B-Instruct-v0.3)
        '[TOOL_CALLS] [{"name": "get_weather", "arguments": {"city": "Paris"}}, '
        '{"name": "get_time", "arguments": {"tz": "Europe/Paris"}}]',
        [("get_weather", {"city": "Paris"}), ("get_time", {"tz": "Europe/Paris"})],
        "",
    ),
    (
        "mistral",  # v11+
        'Sure.[TOOL_CALLS]get_weather{"city": "Zürich"}[TOOL_CALLS]get_time{"tz": "UTC"}',
        [("get_weather", {"city": "Zürich"}), ("get_time", {"tz": "UTC"})],
        "Sure.",
    ),
    (
        "mistral",  # vLLM 0.33.0 [ARGS] form
        '[TOOL_CALLS]get_weather[ARGS]{"city": "Lyon", "days": 1}',
        [("get_weather", {"city": "Lyon", "days": 1})],
        "",
    ),
    (
        "pythonic",
        "[get_weather(city='San Francisco', metric=True), get_time(tz=\"UTC\", offset=-2)]",
        [
            ("get_weather", {"city": "San Francisco", "metric": True}),
            ("get_time", {"tz": "UTC", "offset": -2}),
        ],
        "",
    ),
    (
        "pythonic",
        "I will call the tool.\n[search(query='a [bracket] (paren)', filters={'lang': ['en', 'fr']}, limit=None)]",
        [
            (
                "search",
                {"query": "a [bracket] (paren)", "filters": {"lang": ["en", "fr"]}, "limit": None},
            )
        ],
        "I will call the tool.",
    ),
    (
        "pythonic",  # a bracketed call inside prose is prose
        "Use [f(x)] notation, then:\n[g(a=1)]",
        [("g", {"a": 1})],
        "Use [f(x)] notation, then:",
    ),
    (
        "llama4_pythonic",
        "<|python_start|>[get_weather(city='Oslo'), ping()]<|python_end|>",
        [("get_weather", {"city": "Oslo"}), ("ping", {})],
        "",
    ),
    (
        "llama4_pythonic",  # end token missing
        "<|python_start|>[get_weather(city='Oslo')]",
        [("get_weather", {"city": "Oslo"})],
        "",
    ),
    (
        "olmo3",
        'Let me check.\n<function_calls>get_weather(city="Paris", metric=true)\n'
        "get_time(tz=null)\nsearch(q='multi\\nline', n=2)</function_calls>",
        [
            ("get_weather", {"city": "Paris", "metric": True}),
            ("get_time", {"tz": None}),
            ("search", {"q": "multi\nline", "n": 2}),
        ],
        "Let me check.",
    ),
    (
        "deepseek_v3",
        "I'll check both.\n"
        + DS["begin"]
        + DS["call"]
        + "function"
        + DS["sep"]
        + 'get_weather\n```json\n{"city": "Paris"}\n```'
        + DS["call_end"]
        + "\n"
        + DS["call"]
        + "function"
        + DS["sep"]
        + 'get_weather\n```json\n{"city": "北京", "days": 2}\n```'
        + DS["call_end"]
        + DS["end"],
        [("get_weather", {"city": "Paris"}), ("get_weather", {"city": "北京", "days": 2})],
        "I'll check both.",
    ),
    (
        "deepseek_v31",
        "Checking."
        + DS["begin"]
        + DS["call"]
        + "get_weather"
        + DS["sep"]
        + '{"city": "Rome"}'
        + DS["call_end"]
        + DS["call"]
        + "get_time"
        + DS["sep"]
        + "{}"
        + DS["call_end"]
        + DS["end"],
        [("get_weather", {"city": "Rome"}), ("get_time", {})],
        "Checking.",
    ),
    (
        "granite",
        '<|tool_call|>[{"arguments": {"city": "Boston"}, "name": "get_weather"}, '
        '{"arguments": {}, "name": "ping"}]',
        [("get_weather", {"city": "Boston"}), ("ping", {})],
        "",
    ),
    (
        "granite",  # 3.1+ marker, prose before
        'Calling now.<tool_call>[{"name": "get_weather", "arguments": {"city": "Kyiv"}}]',
        [("get_weather", {"city": "Kyiv"})],
        "Calling now.",
    ),
    (
        "granite-20b-fc",
        '<function_call> {"name": "a", "arguments": {"x": 1}}\n'
        '<function_call> {"name": "b", "arguments": {"y": "z"}}',
        [("a", {"x": 1}), ("b", {"y": "z"})],
        "",
    ),
    (
        "internlm",
        'Let me search.<|action_start|><|plugin|>\n{"name": "search", "parameters": {"q": "InternLM"}}'
        "<|action_end|>",
        [("search", {"q": "InternLM"})],
        "Let me search.",
    ),
    (
        "jamba",
        '<tool_calls>[{"name": "a", "arguments": {"n": 1}}, {"name": "b", "arguments": {}}]</tool_calls>',
        [("a", {"n": 1}), ("b", {})],
        "",
    ),
    (
        "hunyuan_a13b",
        'Thinking done.\n<tool_calls>[{"name": "get_weather", "arguments": {"city": "深圳"}}]</tool_calls>',
        [("get_weather", {"city": "深圳"})],
        "Thinking done.",
    ),
    (
        "minimax",
        '<tool_calls>\n{"name": "a", "arguments": {"x": 1}}\n{"name": "b", "arguments": {"y": 2}}\n'
        "</tool_calls>",
        [("a", {"x": 1}), ("b", {"y": 2})],
        "",
    ),
    (
        "kimi_k2",
        "Let me check.<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0 "
        '<|tool_call_argument_begin|>{"city": "Beijing"}<|tool_call_end|>'
        '<|tool_call_begin|>functions.search:1<|tool_call_argument_begin|>{"q": "x"}'
        "<|tool_call_end|><|tool_calls_section_end|>",
        [("get_weather", {"city": "Beijing"}), ("search", {"q": "x"})],
        "Let me check.",
    ),
    (
        "glm45",
        "I'll look it up.\n<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>北京</arg_value>\n"
        "<arg_key>days</arg_key>\n<arg_value>2</arg_value>\n</tool_call>"
        "<tool_call>ping</tool_call>",
        [("get_weather", {"city": "北京", "days": "2"}), ("ping", {})],
        "I'll look it up.",
    ),
    (
        "glm47",  # no newline after the name
        "<tool_call>search<arg_key>q</arg_key><arg_value>a b</arg_value></tool_call>",
        [("search", {"q": "a b"})],
        "",
    ),
    (
        "minimax_m2",
        'Sure.\n<minimax:tool_call>\n<invoke name="get_weather">\n<parameter name="city">Paris</parameter>\n'
        '<parameter name="days">3</parameter>\n</invoke>\n<invoke name="ping">\n</invoke>\n'
        "</minimax:tool_call>",
        [("get_weather", {"city": "Paris", "days": "3"}), ("ping", {})],
        "Sure.",
    ),
    (
        "seed_oss",
        "<seed:think>plan</seed:think>\n<seed:tool_call>\n<function=get_weather>\n"
        "<parameter=city>Paris</parameter>\n</function>\n</seed:tool_call>",
        [("get_weather", {"city": "Paris"})],
        "<seed:think>plan</seed:think>",
    ),
    (
        "deepseek_v32",
        f'Checking.\n<{DSML}function_calls>\n<{DSML}invoke name="get_weather">\n'
        f'<{DSML}parameter name="city" string="true">Hangzhou</{DSML}parameter>\n'
        f'<{DSML}parameter name="days" string="false">3</{DSML}parameter>\n'
        f'<{DSML}parameter name="options" string="false">{{"unit": "C"}}</{DSML}parameter>\n'
        f"</{DSML}invoke>\n</{DSML}function_calls>",
        [("get_weather", {"city": "Hangzhou", "days": 3, "options": {"unit": "C"}})],
        "Checking.",
    ),
    (
        "step3",
        "Ok.<｜tool_calls_begin｜><｜tool_call_begin｜>function<｜tool_sep｜>"
        '<steptml:invoke name="get_weather"><steptml:parameter name="city">Paris</steptml:parameter>'
        "</steptml:invoke><｜tool_call_end｜><｜tool_calls_end｜>",
        [("get_weather", {"city": "Paris"})],
        "Ok.",
    ),
    (
        "longcat",
        'Hi.\n<longcat_tool_call>\n{"name": "a", "arguments": {"b": [1, {"c": null}]}}\n</longcat_tool_call>\n'
        '<longcat_tool_call>{"name": "d", "arguments": {}}</longcat_tool_call>',
        [("a", {"b": [1, {"c": None}]}), ("d", {})],
        "Hi.",
    ),
    (
        "ernie45",
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>',
        [("get_weather", {"city": "Paris"})],
        "",
    ),
    (
        "xlam",
        '[{"name": "get_weather", "arguments": {"city": "Paris"}}]',
        [("get_weather", {"city": "Paris"})],
        "",
    ),
    (
        "xlam",
        'Here:\n```json\n[{"name": "a", "arguments": {"x": 1}}, {"name": "b", "arguments": {}}]\n```',
        [("a", {"x": 1}), ("b", {})],
        "Here:",
    ),
    (
        "xlam",
        'Ok [TOOL_CALLS][{"name": "a", "arguments": {"x": 1}}]',
        [("a", {"x": 1})],
        "Ok",
    ),
    (
        "xlam",
        '<tool_call>[{"name": "a", "arguments": {"x": 1}}]</tool_call>',
        [("a", {"x": 1})],
        "",
    ),
    (
        "phi4_mini_json",
        'functools[{"name": "get_weather", "arguments": {"city": "Paris"}}]',
        [("get_weather", {"city": "Paris"})],
        "",
    ),
    (
        "gigachat3",
        'Sure.<|function_call|>{"name": "get_weather", "arguments": {"city": "Москва"}}',
        [("get_weather", {"city": "Москва"})],
        "Sure.",
    ),
    (
        "functiongemma",
        "<start_function_call>call:get_weather{city:<escape>Paris, France<escape>,days:3}"
        "<end_function_call><start_function_call>call:search{q:<escape>a{b}:c<escape> "
        "tags:[<escape>x<escape>,<escape>y<escape>] opts:{deep:true}}<end_function_call>",
        [
            ("get_weather", {"city": "Paris, France", "days": 3}),
            ("search", {"q": "a{b}:c", "tags": ["x", "y"], "opts": {"deep": True}}),
        ],
        "",
    ),
    (
        "openai",
        "<|channel|>analysis<|message|>Need weather.<|end|><|start|>assistant<|channel|>commentary "
        'to=functions.get_weather <|constrain|>json<|message|>{"city": "SF"}<|call|>',
        [("get_weather", {"city": "SF"})],
        "",
    ),
    (
        "xml_block",
        'Let me add.\n<tool name="add" tag="A">{"a": 1, "b": 2}</tool>',
        [("add", {"a": 1, "b": 2})],
        "Let me add.",
    ),
    (
        "simple_tool",
        'I\'ll ask the clock.\n<tool>time.get_current_time\n{"timezone": "Asia/Tokyo"}</tool>',
        [("time.get_current_time", {"timezone": "Asia/Tokyo"})],
        "I'll ask the clock.",
    ),
]


def _calls(result: ParseResult) -> Calls:
    return [(call.tool, call.args) for call in result.calls]


@pytest.mark.parametrize(("family", "response", "calls", "text"), CASES)
def test_realistic_outputs(family: str, response: str, calls: Calls, text: str) -> None:
    result = get_parser(family)(response)
    assert result.errors == []
    assert _calls(result) == calls
    assert result["text"] == text
    assert result["meta"]["count"] == len(calls)
    ids = [call.id for call in result.calls]
    assert all(ids) and len(set(ids)) == len(ids)
    # Same input, same ids; a chat message dict gives the same result.
    again = get_parser(family)({"role": "assistant", "content": response})
    assert [call.id for call in again.calls] == ids
    assert again.text == result.text


@pytest.mark.parametrize("family", sorted({case[0] for case in CASES}))
def test_plain_prose_has_no_calls(family: str) -> None:
    prose = "The answer is 42. Nothing to call here; see {braces} and [lists]."
    result = get_parser(family)(prose)
    assert result.calls == [] and result.errors == []
    assert result.text == prose


def test_model_ids_are_kept() -> None:
    kimi = get_parser("kimi_k2")(CASES[[c[0] for c in CASES].index("kimi_k2")][1])
    assert [c.id for c in kimi.calls] == ["functions.get_weather:0", "functions.search:1"]
    mistral = get_parser("mistral")(
        '[TOOL_CALLS]get_weather[CALL_ID]a1B2c3D4e[ARGS]{"city": "Nice"}'
    )
    assert mistral.calls[0].id == "a1B2c3D4e"
    assert mistral.calls[0].args == {"city": "Nice"}
    pre = get_parser("mistral")('[TOOL_CALLS] [{"name": "f", "arguments": {}, "id": "abcdefghi"}]')
    assert pre.calls[0].id == "abcdefghi"


# --- schema-typed values ---------------------------------------------------------

QWEN3_CODER = (
    "I'll check the forecast.\n<tool_call>\n<function=get_weather>\n<parameter=city>\nSão Paulo\n"
    "</parameter>\n<parameter=days>\n5\n</parameter>\n<parameter=metric>\ntrue\n</parameter>\n"
    '<parameter=ratio>\n0.5\n</parameter>\n<parameter=options>\n{"unit": "C"}\n</parameter>\n'
    '<parameter=tags>\n["a", "b"]\n</parameter>\n</function>\n</tool_call>'
)


def test_qwen3_coder_types_values_with_the_schema() -> None:
    result = get_parser("qwen3_coder", tools=[WEATHER_SPEC])(QWEN3_CODER)
    assert result.errors == [] and result.text == "I'll check the forecast."
    assert _calls(result) == [
        (
            "get_weather",
            {
                "city": "São Paulo",
                "days": 5,
                "metric": True,
                "ratio": 0.5,
                "options": {"unit": "C"},
                "tags": ["a", "b"],
            },
        )
    ]


def test_qwen3_coder_without_tools_keeps_strings() -> None:
    result = get_parser("qwen3_xml")(QWEN3_CODER)
    args = result.calls[0].args
    assert args["days"] == "5" and args["metric"] == "true" and args["options"] == '{"unit": "C"}'


def test_schema_from_a_tool_registry() -> None:
    from toolservices.tools import ToolRegistry, tool

    @tool
    def get_weather(city: str, days: int = 1) -> dict[str, Any]:
        """Forecast.

        Args:
            city: City name.
            days: Number of days.
        """
        return {"city": city, "days": days}

    registry = ToolRegistry()
    registry.register(get_weather)
    parser = get_parser("minimax_m2", tools=registry)
    result = parser(CASES[[c[0] for c in CASES].index("minimax_m2")][1])
    assert result.calls[0].args == {"city": "Paris", "days": 3}


def test_schema_typing_keeps_text_that_does_not_convert() -> None:
    response = (
        "<tool_call>get_weather<arg_key>days</arg_key><arg_value>soon</arg_value></tool_call>"
    )
    result = get_parser("glm45", tools=[WEATHER_SPEC])(response)
    assert result.calls[0].args == {"days": "soon"}  # validation reports it, not the parser


def test_qwen3_coder_tolerates_missing_closing_parameter_tags() -> None:
    response = (
        "<tool_call>\n<function=run>\n<parameter=code>\nfor i in range(3):\n    print(i)\n"
        "<parameter=lang>\npython\n</function>\n</tool_call>"
    )
    result = get_parser("qwen3_coder")(response)
    assert result.errors == []
    assert result.calls[0].args == {"code": "for i in range(3):\n    print(i)", "lang": "python"}


def test_qwen3_coder_multiline_values_keep_inner_whitespace() -> None:
    code = "def f():\n    return '<b>'\n\n\nprint(f())"
    response = f"<tool_call>\n<function=python>\n<parameter=code>\n{code}\n</parameter>\n</function>\n</tool_call>"
    assert get_parser("qwen3_coder")(response).calls[0].args == {"code": code}


def test_deepseek_v32_string_attribute_wins_over_schema() -> None:
    response = (
        f'<{DSML}function_calls><{DSML}invoke name="get_weather">'
        f'<{DSML}parameter name="city" string="true">123</{DSML}parameter>'
        f'<{DSML}parameter name="days" string="false">7</{DSML}parameter>'
        f"</{DSML}invoke></{DSML}function_calls>"
    )
    result = get_parser("deepseek_v32", tools=[WEATHER_SPEC])(response)
    assert result.calls[0].args == {"city": "123", "days": 7}


def test_ascii_bars_are_not_deepseek_tokens() -> None:
    response = "<|tool▁calls▁begin|><|tool▁call▁begin|>function<|tool▁sep|>f\n```json\n{}\n```"
    result = get_parser("deepseek_v3")(response)
    assert result.calls == [] and result.errors == [] and result.text == response


def test_harmony_visible_text_is_the_final_channel() -> None:
    response = (
        "<|channel|>analysis<|message|>Simple question.<|end|>"
        "<|start|>assistant<|channel|>final<|message|>It is 4.<|return|>"
    )
    result = get_parser("openai")(response)
    assert result.calls == [] and result.text == "It is 4."
    assert result.meta["reasoning"] == "Simple question."


@pytest.mark.parametrize(
    ("response", "calls", "text", "reasoning"),
    [
        (
            "<|channel|>analysis<|message|>User asks weather.<|end|><|start|>assistant "
            'to=functions.get_weather<|channel|>commentary json<|message|>{"city": "SF"}<|call|>',
            [("get_weather", {"city": "SF"})],
            "",
            "User asks weather.",
        ),
        (
            "analysis<|message|>hmm<|end|><|start|>assistant<|channel|>final<|message|>Done.<|return|>",
            [],
            "Done.",
            "hmm",
        ),
        (
            "<|channel|>commentary<|message|>Let me check.<|end|><|start|>assistant<|channel|>"
            'commentary to=functions.a <|constrain|>json<|message|>{"x": 1}<|call|><|start|>'
            "assistant<|channel|>commentary to=functions.b <|constrain|>json<|message|>{}<|call|>",
            [("a", {"x": 1}), ("b", {})],
            "Let me check.",
            None,
        ),
    ],
)
def test_harmony_variants(response: str, calls: Calls, text: str, reasoning: str | None) -> None:
    result = get_parser("gpt_oss")(response)
    assert result.errors == []
    assert _calls(result) == calls
    assert result.text == text
    assert result.meta.get("reasoning") == reasoning


def test_kimi_with_newlines_and_short_ids() -> None:
    response = (
        "<|tool_calls_section_begin|>\n<|tool_call_begin|>\nfunctions.get_weather:0"
        '<|tool_call_argument_begin|>\n{"location": "Tokyo"}\n<|tool_call_end|>\n'
        '<|tool_call_begin|>search:1<|tool_call_argument_begin|>{"q": "x"}<|tool_call_end|>\n'
        "<|tool_calls_section_end|>"
    )
    result = get_parser("kimi_k2")(response)
    assert _calls(result) == [("get_weather", {"location": "Tokyo"}), ("search", {"q": "x"})]
    assert [c.id for c in result.calls] == ["functions.get_weather:0", "search:1"]


def test_llama3_reads_the_openai_call_shape() -> None:
    response = '{"type": "function", "function": {"name": "f", "parameters": {"a": 1}}}'
    assert _calls(get_parser("llama3_json")(response)) == [("f", {"a": 1})]


def test_openai_content_parts_are_read() -> None:
    message = {
        "role": "assistant",
        "content": [
            {"type": "text", "text": "Checking. "},
            {"type": "text", "text": '<tool_call>{"name": "f", "arguments": {}}</tool_call>'},
        ],
    }
    result = get_parser("hermes")(message)
    assert _calls(result) == [("f", {})] and result.text == "Checking."


HOSTILE = [
    '{"a": ' * 20000,
    '{"name": ' * 20000,
    "{" * 100000,
    "[{" * 30000,
    "[f(a=[" * 20000,
    "<tool_call>" * 20000,
    "[TOOL_CALLS]" * 20000,
    '"' * 100000,
    "x(" * 50000,
    "<function=x>" * 20000,
    "<|tool_calls_section_begin|>" * 10000,
]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("family", sorted(PARSERS))
def test_hostile_inputs_are_handled_without_raising(family: str) -> None:
    parser = get_parser(family)
    for response in HOSTILE:
        result = parser(response)
        assert isinstance(result.text, str)


@pytest.mark.parametrize("family", sorted(set(PARSERS) - {"json_envelope", "openai"}))
def test_prose_before_and_after_the_calls(family: str) -> None:
    from toolservices.parsing import ToolCall

    parser = get_parser(family)
    if family == "python_block":
        calls = [ToolCall("python", {"code": "print('ü')"})] * 2
    else:
        calls = [ToolCall("lookup", {"q": "naïve café"}), ToolCall("ping", {"n": "1"})]
    response = f"Before the calls.\n{parser.render(calls)}\nAfter the calls."
    result = parser(response)
    assert result.errors == []
    assert _calls(result) == [(c.tool, c.args) for c in calls]
    assert result.text.startswith("Before the calls.")
    assert result.text.endswith("After the calls.")
