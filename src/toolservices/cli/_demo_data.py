"""Bundled assistant turns for the demo, written as each model family emits them.

Four scenarios per format. The fourth starts with a malformed or invalid call
(as models do during RL) and recovers on the next turn.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["FORMAT_TURNS", "SCENARIOS", "Scenario"]


@dataclass(frozen=True, kw_only=True)
class Scenario:
    name: str
    prompt: str
    #: Text every successful tool result of the episode, joined, must contain.
    expect: tuple[str, ...]
    #: Whether the first turn is meant to fail (malformed or invalid call).
    first_turn_fails: bool = False


SCENARIOS = [
    Scenario(
        name="weather",
        prompt="What is the weather in Paris and in Tokyo right now?",
        expect=("Paris", "Tokyo", "cloudy", "sunny"),
    ),
    Scenario(name="math", prompt="What is 17 * 23 + 4?", expect=("395",)),
    Scenario(
        name="search",
        prompt="How does the fork server make sessions cheap?",
        expect=("pre-imports modules",),
    ),
    Scenario(
        name="recover",
        prompt="Compute 2 to the power of 10.",
        expect=("1024",),
        first_turn_fails=True,
    ),
]

_DS_BEGIN = "<｜tool▁calls▁begin｜>"
_DS_END = "<｜tool▁calls▁end｜>"


def _ds(name: str, args: str) -> str:
    return f"<｜tool▁call▁begin｜>function<｜tool▁sep｜>{name}\n```json\n{args}\n```<｜tool▁call▁end｜>"


_ANSWERS = [
    "Paris: 18°C and cloudy. Tokyo: 24°C and sunny.",
    "17 * 23 + 4 = 395.",
    "The fork server pre-imports modules once and forks new sessions in milliseconds.",
    "2 to the power of 10 is 1024.",
]

#: format -> one list of assistant turns per scenario (same order as SCENARIOS).
FORMAT_TURNS: dict[str, list[list[str]]] = {
    "hermes": [
        [
            "I'll look up both cities.\n"
            '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
            '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Tokyo"}}\n</tool_call>',
        ],
        [
            '<tool_call>\n{"name": "calculator", "arguments": {"expression": "17 * 23 + 4"}}\n</tool_call>'
        ],
        [
            '<tool_call>\n{"name": "search_docs", "arguments": '
            '{"query": "fork server sessions", "top_k": 1}}\n</tool_call>'
        ],
        [
            '<tool_call>\n{"name": "calculator", "arguments": {"expression": "2 ** 10"}\n</tool_call>',
            'Sorry, my JSON was broken.\n<tool_call>\n{"name": "calculator", '
            '"arguments": {"expression": "2 ** 10"}}\n</tool_call>',
        ],
    ],
    "llama3_json": [
        [
            '{"name": "get_weather", "parameters": {"city": "Paris"}}; '
            '{"name": "get_weather", "parameters": {"city": "Tokyo"}}'
        ],
        ['{"name": "calculator", "parameters": {"expression": "17 * 23 + 4"}}'],
        ['{"name": "search_docs", "parameters": {"query": "fork server sessions", "top_k": 1}}'],
        [
            '{"name": "calculator", "parameters": {"expression": 2 ** 10}}',
            '{"name": "calculator", "parameters": {"expression": "2 ** 10"}}',
        ],
    ],
    "mistral": [
        ['[TOOL_CALLS]get_weather{"city": "Paris"}[TOOL_CALLS]get_weather{"city": "Tokyo"}'],
        ['[TOOL_CALLS][{"name": "calculator", "arguments": {"expression": "17 * 23 + 4"}}]'],
        ['[TOOL_CALLS]search_docs{"query": "fork server sessions", "top_k": 1}'],
        [
            '[TOOL_CALLS]calculator{"expression": "2 ** 10"',
            '[TOOL_CALLS]calculator{"expression": "2 ** 10"}',
        ],
    ],
    "pythonic": [
        ['[get_weather(city="Paris"), get_weather(city="Tokyo")]'],
        ["[calculator(expression='17 * 23 + 4')]"],
        ['[search_docs(query="fork server sessions", top_k=1)]'],
        ['[calculator(expression="2 ** 10")', '[calculator(expression="2 ** 10")]'],
    ],
    "qwen3_coder": [
        [
            "Checking both cities.\n"
            "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"
            "</function>\n</tool_call>\n"
            "<tool_call>\n<function=get_weather>\n<parameter=city>\nTokyo\n</parameter>\n"
            "</function>\n</tool_call>"
        ],
        [
            "<tool_call>\n<function=calculator>\n<parameter=expression>\n17 * 23 + 4\n"
            "</parameter>\n</function>\n</tool_call>"
        ],
        [
            "<tool_call>\n<function=search_docs>\n<parameter=query>\nfork server sessions\n"
            "</parameter>\n<parameter=top_k>\n1\n</parameter>\n</function>\n</tool_call>"
        ],
        [
            "<tool_call>\n<function=calculator>\n<parameter=expression>\n2 ** 10\n",
            "<tool_call>\n<function=calculator>\n<parameter=expression>\n2 ** 10\n"
            "</parameter>\n</function>\n</tool_call>",
        ],
    ],
    "deepseek_v3": [
        [
            _DS_BEGIN
            + _ds("get_weather", '{"city": "Paris"}')
            + _ds("get_weather", '{"city": "Tokyo"}')
            + _DS_END
        ],
        [_DS_BEGIN + _ds("calculator", '{"expression": "17 * 23 + 4"}') + _DS_END],
        [_DS_BEGIN + _ds("search_docs", '{"query": "fork server sessions", "top_k": 1}') + _DS_END],
        [
            _DS_BEGIN + _ds("calculator", '{"expression": "2 ** 10"'),
            _DS_BEGIN + _ds("calculator", '{"expression": "2 ** 10"}') + _DS_END,
        ],
    ],
    "xml_block": [
        [
            'Looking both up. <tool name="get_weather">{"city": "Paris"}</tool>'
            '<tool name="get_weather" tag="second">{"city": "Tokyo"}</tool>'
        ],
        ['<tool name="calculator">{"expression": "17 * 23 + 4"}</tool>'],
        ['<tool name="search_docs">{"query": "fork server sessions", "top_k": 1}</tool>'],
        [
            '<tool name="calculator">expression: 2 ** 10</tool>',
            '<tool name="calculator">{"expression": "2 ** 10"}</tool>',
        ],
    ],
    "json_envelope": [
        [
            '{"message": "Checking both cities.", "tools": ['
            '{"tool": "get_weather", "args": {"city": "Paris"}}, '
            '{"tool": "get_weather", "args": {"city": "Tokyo"}, "tag": "second"}]}'
        ],
        [
            '{"message": "", "tools": [{"tool": "calculator", "args": {"expression": "17 * 23 + 4"}}]}'
        ],
        [
            '{"message": "", "tools": [{"tool": "search_docs", '
            '"args": {"query": "fork server sessions", "top_k": 1}}]}'
        ],
        [
            '{"message": "", "tools": [{"tool": "calculator", "args": {"expr": "2 ** 10"}}]}',
            '{"message": "Fixed.", "tools": [{"tool": "calculator", "args": {"expression": "2 ** 10"}}]}',
        ],
    ],
}

# Every episode ends with a plain answer (no calls), which finishes it.
for _fmt, _episodes in FORMAT_TURNS.items():
    for _turns, _answer in zip(_episodes, _ANSWERS, strict=True):
        _turns.append(
            f'{{"message": "{_answer}", "tools": []}}' if _fmt == "json_envelope" else _answer
        )
