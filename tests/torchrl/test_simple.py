"""SimpleToolTransform on real ChatEnvs, compared with TorchRL's on the same inputs."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from torchrl.envs.llm.transforms import SimpleToolTransform as TorchRLSimple

from toolservices.torchrl import SimpleToolTransform, XMLBlockParser


def add(a: int, b: int) -> dict[str, int]:
    return {"sum": a + b}


def echo(text: str) -> str:
    return text


TOOLS = {"add": add, "echo": echo}


@pytest.mark.parametrize(
    "texts",
    [
        ['<tool>add\n{"a": 1, "b": 2}</tool> and <tool>echo\n{"text": "hi"}</tool>', "none"],
        ['<tool>echo\n{"text": "a b"}</tool>', '<tool>add\n{"a": 2, "b": 3}</tool>'],
    ],
)
def test_same_text_as_torchrl(chat: Any, texts: list[str]) -> None:
    ours, theirs = chat(SimpleToolTransform(TOOLS), 2), chat(TorchRLSimple(TOOLS), 2)
    ours.step(texts)
    theirs.step(texts)
    assert ours.conversations()[0] == theirs.conversations()[0]
    assert ours.conversations()[1] == theirs.conversations()[1]


def test_failure_texts(chat: Any) -> None:
    driver = chat(SimpleToolTransform(TOOLS), 3)
    driver.step(["<tool>nope\n{}</tool>", "<tool>add\n{bad}</tool>", '<tool>add\n{"a": 1}</tool>'])
    assert driver.tool_texts(0) == [
        "Tool nope failed:\nTool nope not found. Available tools: add, echo"
    ]
    assert driver.tool_texts(1)[0].startswith(
        "Tool add failed:\nFailed to parse tool arguments: Expecting property name"
    )
    assert driver.tool_texts(2)[0].startswith("Tool add failed:\n")
    assert "'b'" in driver.tool_texts(2)[0]


def test_exception_text_matches_torchrl(chat: Any) -> None:
    def boom(**kwargs: Any) -> None:
        raise RuntimeError("it broke")

    ours, theirs = (
        chat(SimpleToolTransform({"boom": boom}), 1),
        chat(TorchRLSimple({"boom": boom}), 1),
    )
    for driver in (ours, theirs):
        driver.step(["<tool>boom\n{}</tool>"])
    assert (
        ours.tool_texts(0)
        == theirs.tool_texts(0)
        == ["Tool boom failed:\nTool execution failed: it broke"]
    )


def test_custom_pattern_and_parser(chat: Any) -> None:
    pattern = SimpleToolTransform(TOOLS, tool_call_pattern=r"CALL\[(.*?)\]\((.*?)\)")
    parser = SimpleToolTransform(TOOLS, parser=XMLBlockParser())
    family = SimpleToolTransform(TOOLS, parser="hermes")
    drivers = [chat(t, 1) for t in (pattern, parser, family)]
    drivers[0].step(['CALL[add]({"a": 3, "b": 4})'])
    drivers[1].step(['<tool name="add">{"a": 3, "b": 4}</tool>'])
    drivers[2].step(['<tool_call>{"name": "add", "arguments": {"a": 3, "b": 4}}</tool_call>'])
    for driver in drivers:
        assert driver.tool_texts(0) == ["Tool add executed successfully:\n{'sum': 7}"]


def test_timeout_is_enforced(chat: Any) -> None:
    release = threading.Event()
    finished: list[str] = []

    def slow() -> str:
        release.wait(60)
        finished.append("late")
        return "late"

    driver = chat(SimpleToolTransform({"slow": slow}, timeout=0.2), 1)
    try:
        driver.step(["<tool>slow\n{}</tool>"])
        # The step came back while the tool was still blocked: not waited for.
        assert finished == []
    finally:
        release.set()
    assert "timed out" in driver.tool_texts(0)[0]
    assert driver.metric("timeouts") == [1]


def test_schemas_validate_and_give_specs(chat: Any) -> None:
    schema = {
        "type": "object",
        "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
        "required": ["a", "b"],
    }
    transform = SimpleToolTransform({"add": lambda **kw: kw["a"] + kw["b"]}, {"add": schema})
    assert transform.tool_specs[0]["function"]["parameters"] == schema
    driver = chat(transform, 1)
    driver.step(['<tool>add\n{"a": 1, "b": "x"}</tool>'])
    assert driver.tool_texts(0)[0].startswith("Tool add failed:\nInvalid arguments")


def test_callable_objects_and_lambdas(chat: Any) -> None:
    class Doubler:
        def __call__(self, x: int) -> int:
            return 2 * x

    driver = chat(SimpleToolTransform({"double": Doubler(), "neg": lambda x: -x}), 1)
    driver.step(['<tool>double\n{"x": 4}</tool><tool>neg\n{"x": 4}</tool>'])
    assert driver.tool_texts(0) == [
        "Tool double executed successfully:\n8",
        "Tool neg executed successfully:\n-4",
    ]
