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


ADD_SCHEMA = {
    "type": "object",
    "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
    "required": ["a", "b"],
}


def test_schemas_give_specs_and_validate_only_when_asked(chat: Any) -> None:
    def add_any(**kw: Any) -> Any:
        return kw["a"] + kw["b"]

    lenient = SimpleToolTransform({"add": add_any}, {"add": ADD_SCHEMA})
    strict = SimpleToolTransform({"add": add_any}, {"add": ADD_SCHEMA}, validate_arguments=True)
    assert lenient.tool_specs[0]["function"]["parameters"] == ADD_SCHEMA
    assert strict.tool_specs == lenient.tool_specs
    texts = ['<tool>add\n{"a": 1, "b": "x"}</tool>']
    drivers = [chat(lenient, 1), chat(strict, 1)]
    for driver in drivers:
        driver.step(texts)
    # As in TorchRL the tool itself meets the bad argument...
    assert drivers[0].tool_texts(0) == [
        "Tool add failed:\nTool execution failed: "
        "unsupported operand type(s) for +: 'int' and 'str'"
    ]
    # ...unless the schema is asked to check it first.
    assert drivers[1].tool_texts(0)[0].startswith("Tool add failed:\nInvalid arguments")


def calculator(operation: str, a: float, b: float) -> dict[str, Any]:
    if operation == "add":
        return {"result": a + b, "types": [type(a).__name__, type(b).__name__]}
    raise ValueError(f"Unknown operation: {operation}")


CALCULATOR_SPEC = {
    "name": "calculator",
    "parameters": {
        "type": "object",
        "properties": {
            "operation": {"type": "string", "enum": ["add", "multiply"]},
            "a": {"type": "number"},
            "b": {"type": "number"},
        },
        "required": ["operation", "a", "b"],
    },
}


@pytest.mark.parametrize("schemas", [None, {"calculator": CALCULATOR_SPEC}])
def test_whole_numbers_arrive_as_ints(chat: Any, schemas: Any) -> None:
    driver = chat(SimpleToolTransform({"calculator": calculator}, schemas), 1)
    driver.step(['<tool>calculator\n{"operation": "add", "a": 2, "b": 3.5}</tool>'])
    assert driver.tool_texts(0) == [
        "Tool calculator executed successfully:\n{'result': 5.5, 'types': ['int', 'float']}"
    ]


def test_the_tools_own_error_reaches_the_model(chat: Any) -> None:
    """An enum in the schema does not answer for the tool: its own message does."""
    ours = chat(SimpleToolTransform({"calculator": calculator}, {"calculator": CALCULATOR_SPEC}), 1)
    theirs = chat(TorchRLSimple({"calculator": calculator}, {"calculator": CALCULATOR_SPEC}), 1)
    for driver in (ours, theirs):
        driver.step(['<tool>calculator\n{"operation": "invalid", "a": 2, "b": 3}</tool>'])
    assert (
        ours.tool_texts(0)
        == theirs.tool_texts(0)
        == ["Tool calculator failed:\nTool execution failed: Unknown operation: invalid"]
    )


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
