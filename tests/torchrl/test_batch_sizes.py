"""Every transform at batch sizes 1 to 8: right messages, right padding, right item."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from toolservices.torchrl import (
    ExecuteToolsInOrder,
    MCPToolTransform,
    PythonInterpreter,
    SimpleToolTransform,
    ToolRegistry,
)

SERVER = str(Path(__file__).parent / "servers" / "tools_server.py")
SIZES = [1, 2, 4, 7, 8]


def echo(i: int) -> str:
    """Echo the item index."""
    return f"item {i}"


def calls_for(i: int) -> int:
    """Item i makes i % 3 calls (0, 1 or 2)."""
    return i % 3


def assert_padded(driver: Any, size: int, expected: dict[int, list[str]]) -> None:
    width = max((len(v) for v in expected.values()), default=0)
    for i in range(size):
        appended = driver.messages_after_last_assistant(i)
        texts = expected.get(i, [])
        assert [m["content"] for m in appended[: len(texts)]] == texts
        assert [m["role"] for m in appended[len(texts) :]] == ["<none>"] * (width - len(texts))


@pytest.mark.parametrize("size", SIZES)
def test_execute_in_order(chat: Any, size: int) -> None:
    driver = chat(ExecuteToolsInOrder(ToolRegistry([echo]), "hermes", result_format="openai"), size)
    call = '<tool_call>{{"name": "echo", "arguments": {{"i": {}}}}}</tool_call>'
    driver.step(["".join(call.format(i) for _ in range(calls_for(i))) for i in range(size)])
    expected = {i: [f"item {i}"] * calls_for(i) for i in range(size) if calls_for(i)}
    assert_padded(driver, size, expected)
    assert driver.metric("calls") == [float(calls_for(i)) for i in range(size)]


@pytest.mark.parametrize("size", SIZES)
def test_simple_tool(chat: Any, size: int) -> None:
    driver = chat(SimpleToolTransform({"echo": echo}), size)
    call = '<tool>echo\n{{"i": {}}}</tool>'
    driver.step(["".join(call.format(i) for _ in range(calls_for(i))) for i in range(size)])
    expected = {
        i: [f"Tool echo executed successfully:\nitem {i}"] * calls_for(i)
        for i in range(size)
        if calls_for(i)
    }
    assert_padded(driver, size, expected)


@pytest.mark.parametrize("size", [1, 8])
def test_python_interpreter(chat: Any, size: int) -> None:
    driver = chat(PythonInterpreter(persistent=True), size)
    driver.step([f"```python\nv = {i}\n```" if i % 2 else "no code" for i in range(size)])
    driver.step([f"```python\nprint(v * {i})\n```" if i % 2 else "no code" for i in range(size)])
    expected = {
        i: [f"Code block 1 executed successfully:\n{i * i}\n"] for i in range(size) if i % 2
    }
    assert_padded(driver, size, expected)


@pytest.fixture(scope="module")
def mcp_transform() -> Iterator[MCPToolTransform]:
    t = MCPToolTransform({"tools": {"command": sys.executable, "args": [SERVER]}})
    yield t
    t.close()


@pytest.mark.parametrize("size", [1, 8])
def test_mcp(chat: Any, size: int, mcp_transform: MCPToolTransform) -> None:
    driver = chat(mcp_transform.clone(), size)
    call = '<tool>tools.add\n{{"a": {}, "b": 1}}</tool>'
    driver.step(["".join(call.format(i) for _ in range(calls_for(i))) for i in range(size)])
    expected = {
        i: [f"Tool tools.add executed successfully:\n{i + 1}"] * calls_for(i)
        for i in range(size)
        if calls_for(i)
    }
    assert_padded(driver, size, expected)
