"""Issue 10 through real ChatEnvs: whatever a tool raises or returns, the step
returns, every item that made a call gets its tool message, and the next step works."""

from __future__ import annotations

import asyncio
import sys
import threading
from collections.abc import Callable
from typing import Any, TypeVar

import pytest

from toolservices import ToolRegistry, tool
from toolservices.torchrl import ExecuteToolsInOrder, SimpleToolTransform

T = TypeVar("T")


def returns(fn: Callable[[], T], *, within: float = 120.0) -> T:
    """``fn()`` in a helper thread; fails the test instead of hanging if it never returns."""
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["value"] = fn()
        except BaseException as exc:
            box["error"] = exc

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(within)
    if thread.is_alive():
        pytest.fail(f"env.step did not return within {within:g} s: the process is wedged")
    if "error" in box:
        raise box["error"]
    return box["value"]


class Custom(BaseException):
    pass


class Unprintable(Exception):
    def __str__(self) -> str:
        raise RuntimeError("no text")


class NoStr:
    def __str__(self) -> str:
        raise ValueError("str() refused")

    __repr__ = __str__


def _deep() -> list[Any]:
    value: list[Any] = []
    for _ in range(100_000):
        value = [value]
    return value


RAISE: dict[str, Callable[[], BaseException]] = {
    "KeyboardInterrupt": KeyboardInterrupt,
    "Custom": lambda: Custom("custom"),
    "CancelledError": asyncio.CancelledError,
    "GeneratorExit": GeneratorExit,
    "Unprintable": Unprintable,
}


def _behave(kind: str) -> Any:
    if kind == "exit":
        sys.exit(1)
    if kind == "nostr":
        return NoStr()
    if kind == "deep":
        return _deep()
    raise RAISE[kind]()


@tool
def bad(kind: str) -> Any:
    """Misbehaves in a worker thread."""
    return _behave(kind)


@tool
async def abad(kind: str) -> Any:
    """Misbehaves on the event loop."""
    return _behave(kind)


KINDS = ["exit", "nostr", "deep", *RAISE]
# Before Python 3.11 an async tool's own CancelledError counts as a real cancellation.
CASES = [("bad", kind) for kind in KINDS] + [
    ("abad", kind) for kind in KINDS if kind != "CancelledError" or sys.version_info >= (3, 11)
]


@pytest.mark.parametrize("result_format", ["tool_results", "openai"])
def test_execute_tools_in_order_answers_every_misbehaving_call(
    chat: Any, result_format: Any
) -> None:
    transform = ExecuteToolsInOrder(
        ToolRegistry([bad, abad]), "xml_block", result_format=result_format
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
        return _behave(kind)

    async def async_bad(kind: str) -> Any:
        return _behave(kind)

    driver = chat(SimpleToolTransform({"bad": sync_bad, "abad": async_bad}), len(CASES))
    texts = [f'<tool>{name}\n{{"kind": "{kind}"}}</tool>' for name, kind in CASES]
    returns(lambda: driver.step(texts))
    for i, (name, kind) in enumerate(CASES):
        (message,) = driver.tool_texts(i)
        assert message.startswith(f"Tool {name} failed:\nTool execution failed: "), (name, kind)
    returns(lambda: driver.step(["done"] * len(CASES)))
