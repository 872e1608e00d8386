"""Issue 10 through real ChatEnvs: whatever a tool raises or returns, the step
returns, every item that made a call gets its tool message, and the next step works."""

from __future__ import annotations

from typing import Any

import pytest
from tests._misbehaving import ALL_KINDS, async_kinds, in_thread, misbehave, on_loop, returns

from toolservices import ToolRegistry
from toolservices.torchrl import ExecuteToolsInOrder, SimpleToolTransform

CASES = [("in_thread", kind) for kind in ALL_KINDS] + [
    ("on_loop", kind) for kind in async_kinds(ALL_KINDS)
]


@pytest.mark.parametrize("result_format", ["tool_results", "openai"])
def test_execute_tools_in_order_answers_every_misbehaving_call(
    chat: Any, result_format: Any
) -> None:
    transform = ExecuteToolsInOrder(
        ToolRegistry([in_thread, on_loop]), "xml_block", result_format=result_format
    )
    driver = chat(transform, len(CASES))
    texts = [f'<tool name="{name}">{{"kind": "{kind}"}}</tool>' for name, kind in CASES]
    returns(lambda: driver.step(texts))
    for i, case in enumerate(CASES):
        (message,) = driver.tool_texts(i)
        assert "failed" in message or message.startswith("Error: "), case
    assert driver.metric("failed_calls") == [1.0] * len(CASES)
    # the env, and the process, go on
    returns(lambda: driver.step(["done"] * len(CASES)))
    assert all(len(driver.tool_texts(i)) == 0 for i in range(len(CASES)))


def test_simple_tool_transform_answers_every_misbehaving_call(chat: Any) -> None:
    def sync_bad(kind: str) -> Any:
        return misbehave(kind)

    async def async_bad(kind: str) -> Any:
        return misbehave(kind)

    driver = chat(SimpleToolTransform({"in_thread": sync_bad, "on_loop": async_bad}), len(CASES))
    texts = [f'<tool>{name}\n{{"kind": "{kind}"}}</tool>' for name, kind in CASES]
    returns(lambda: driver.step(texts))
    for i, (name, kind) in enumerate(CASES):
        (message,) = driver.tool_texts(i)
        assert message.startswith(f"Tool {name} failed:\nTool execution failed: "), (name, kind)
    returns(lambda: driver.step(["done"] * len(CASES)))
