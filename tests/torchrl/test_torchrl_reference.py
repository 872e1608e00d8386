"""Facts about TorchRL 0.14.1's own tool transforms, pinned on real ChatEnvs.

These are the reference our transforms are compared against (same inputs,
same output text where TorchRL is right). If a TorchRL upgrade changes them,
these tests say so first.
"""

from __future__ import annotations

from typing import Any

import pytest
from torchrl.envs.llm.transforms import ExecuteToolsInOrder as TorchRLExecute
from torchrl.envs.llm.transforms import SimpleToolTransform as TorchRLSimple
from torchrl.envs.llm.transforms import ToolRegistry as TorchRLRegistry
from torchrl.envs.llm.transforms import XMLBlockParser as TorchRLXMLParser


class Add:
    name = "add"
    schema_in = {"a": int, "b": int}
    schema_out = {"sum": int}

    def __call__(self, a: int, b: int, **kwargs: object) -> dict[str, int]:
        return {"sum": a + b}


def add(a: int, b: int) -> dict[str, int]:
    return {"sum": a + b}


class Failing:
    name = "failing"
    schema_in: dict[str, object] = {}
    schema_out: dict[str, object] = {}

    def __call__(self, **kwargs: object) -> dict[str, object]:
        raise ValueError("boom")


def test_torchrl_execute_in_order_text_and_padding(
    chat,
) -> None:
    driver = chat(
        TorchRLExecute(registry=TorchRLRegistry([Add(), Failing()]), parser=TorchRLXMLParser()), 3
    )
    driver.reset()
    driver.step(
        [
            '<tool name="add">{"a": 1, "b": 2}</tool><tool name="failing" tag="T">{}</tool>',
            "no call",
            '<tool name="add" tag="A">{"a": 3, "b": 4}</tool>',
        ]
    )
    assert driver.roles(0)[-1] == "tool"
    assert driver.roles(1)[-1] == "<none>"
    assert driver.contents(1)[-1] == ""
    assert driver.tool_texts(0) == [
        "<tool_results>\n"
        "Tool add (call 1) succeeded:\n"
        '  Result: {\n  "sum": 3\n}\n'
        "Tool failing (call 2) failed:\n"
        "  Error: boom\n"
        "</tool_results>"
    ]
    assert driver.tool_texts(2) == [
        '<tool_results>\nTool add (call 1) [tag: A] succeeded:\n  Result: {\n  "sum": 7\n}\n'
        "</tool_results>"
    ]


def test_torchrl_passes_state_to_every_tool(
    chat,
) -> None:
    """The bug we fix: a plain function without **kwargs fails under _state."""

    class Plain:
        name = "plain"
        schema_in: dict[str, object] = {}
        schema_out: dict[str, object] = {}

        def __call__(self, x: int) -> dict[str, int]:
            return {"x": x}

    driver = chat(TorchRLExecute(registry=TorchRLRegistry([Plain()]), parser=TorchRLXMLParser()), 1)
    driver.reset()
    driver.step(['<tool name="plain">{"x": 1}</tool>'])
    assert "unexpected keyword argument '_state'" in driver.tool_texts(0)[0]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ('<tool>add\n{"a": 1, "b": 2}</tool>', ["Tool add executed successfully:\n{'sum': 3}"]),
        ("<tool>nope\n{}</tool>", ["Tool nope failed:\nTool nope not found"]),
        (
            "<tool>add\n{bad}</tool>",
            [
                "Tool add failed:\nFailed to parse tool arguments: Expecting property name "
                "enclosed in double quotes: line 1 column 2 (char 1)"
            ],
        ),
        (
            '<tool>add\n{"a": 1}</tool>',
            [
                "Tool add failed:\nTool execution failed: "
                "add() missing 1 required positional argument: 'b'"
            ],
        ),
    ],
)
def test_torchrl_simple_tool_texts(chat: Any, text: str, expected: list[str]) -> None:
    driver = chat(TorchRLSimple(tools={"add": add}), 1)
    driver.reset()
    driver.step([text])
    assert driver.tool_texts(0) == expected
