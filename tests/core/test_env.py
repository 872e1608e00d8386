"""The framework-free multi-turn environment over OpenAI-format messages."""

from __future__ import annotations

import json

import pytest
from tests._chat import add, hermes

from toolservices import ToolEnv, UserError, tool


@tool
def broken() -> None:
    """Always fails."""
    raise RuntimeError("backend unavailable")


def test_multi_turn_episode_grows_the_conversation() -> None:
    env = ToolEnv([add], parser="hermes", system_prompt="Use tools.")
    conversations = env.reset(["2+3?", "4+5?"])
    assert conversations[0] == [
        {"role": "system", "content": "Use tools."},
        {"role": "user", "content": "2+3?"},
    ]
    step = env.step([hermes("add", {"a": 2, "b": 3}), "No tool needed: 9."])
    assert step.done == [False, True] and step.reasons == [None, "answered"]
    assert step.tool_messages[1] == []
    (message,) = step.tool_messages[0]
    assert message["role"] == "tool" and message["content"] == "5" and message["name"] == "add"
    assistant = env.messages[0][2]
    assert assistant["role"] == "assistant"
    assert assistant["tool_calls"][0]["id"] == message["tool_call_id"]
    assert json.loads(assistant["tool_calls"][0]["function"]["arguments"]) == {"a": 2, "b": 3}

    step = env.step(["The answer is 5.", None])
    assert step.done == [True, True] and step.reasons == ["answered", None]
    assert [m["role"] for m in env.messages[0]] == [
        "system",
        "user",
        "assistant",
        "tool",
        "assistant",
    ]
    assert env.metrics[0].turns == 2 and env.metrics[0].calls == 1
    assert env.metrics[1].turns == 1 and env.metrics[1].calls == 0


def test_failures_count_and_end_the_episode_when_asked() -> None:
    env = ToolEnv([add, broken], parser="hermes", max_failed_turns=2, max_turns=5)
    env.reset(["go"])
    step = env.step([hermes("broken", {})])
    assert not step.done[0]
    assert step.metrics[0].failed_calls == 1
    assert step.tool_messages[0][0]["content"] == "Error: RuntimeError: backend unavailable"
    step = env.step(['<tool_call>\n{"name": "add", "arguments": {"a": 1,\n</tool_call>'])
    assert step.metrics[0].parse_errors == 1
    assert step.done[0] and step.reasons[0] == "too_many_failures"
    assert env.metrics[0].failed_calls == 1 and env.metrics[0].parse_errors == 1


def test_max_turns_and_tool_results_format() -> None:
    env = ToolEnv([add], parser="hermes", max_turns=1, result_format="tool_results")
    env.reset(["go"])
    step = env.step([hermes("add", {"a": 1, "b": 1})])
    assert step.done == [True] and step.reasons == ["max_turns"]
    assert step.tool_messages[0][0]["content"] == (
        "<tool_results>\nTool add (call 1) succeeded:\n  Result: 2\n</tool_results>"
    )


async def test_async_step_and_tool_specs() -> None:
    env = ToolEnv([add], parser="hermes")
    env.reset([[{"role": "user", "content": "1+1"}]])
    step = await env.astep([{"role": "assistant", "content": hermes("add", {"a": 1, "b": 1})}])
    assert step.tool_messages[0][0]["content"] == "2"
    assert env.tool_specs[0]["function"]["name"] == "add"


def test_server_parsed_tool_calls_in_a_message_are_used() -> None:
    env = ToolEnv([add], parser="hermes")
    env.reset(["1+2?"])
    message = {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {
                "id": "srv-1",
                "type": "function",
                "function": {"name": "add", "arguments": '{"a": 1, "b": 2}'},
            }
        ],
    }
    step = env.step([message])
    assert step.done == [False]
    (result,) = step.tool_messages[0]
    assert result["tool_call_id"] == "srv-1" and result["content"] == "3"
    assert env.messages[0][1]["tool_calls"][0]["id"] == "srv-1"


def test_configuration_errors() -> None:
    with pytest.raises(UserError, match="max_turns"):
        ToolEnv([add], max_turns=0)
    with pytest.raises(UserError, match="result_format"):
        ToolEnv([add], result_format="xml")  # type: ignore[arg-type]
    env = ToolEnv([add])
    env.reset(["a", "b"])
    with pytest.raises(UserError, match=r"got 1 response\(s\) for a batch of 2"):
        env.step(["x"])


def test_items_are_episodes_with_their_own_python_sessions() -> None:
    from toolservices import python_tool
    from toolservices.python import PythonExecutorService

    seen: list[dict] = []

    @tool
    def where(_state: dict) -> str:
        """Reports the call state."""
        seen.append(_state)
        return "ok"

    with PythonExecutorService(pool_size=2, timeout=5.0) as executor:
        env = ToolEnv([python_tool(executor), where], parser="hermes")
        env.reset(["a", "b"])
        assert [e.python for e in env.episodes] == [executor, executor]
        code = "x = 1\nprint('x' in globals())"
        step = env.step([hermes("python", {"code": code}), hermes("where", {})])
        assert step.tool_messages[0][0]["content"] == "True\n"
        assert seen[0]["batch_index"] == 1 and seen[0]["episode_id"] == env.episodes[1].id
        step = env.step(["done", hermes("python", {"code": code[6:]})])
        assert step.tool_messages[1][0]["content"] == "False\n"  # item 1 never saw item 0's x
        assert step.reasons == ["answered", None]
        live = executor.stats()["sessions"]
        env.reset(["c"])  # ends the two sessions of the previous batch
        assert executor.stats()["sessions"] == live - 2
        env.close()
        assert env.done == [True] and env.reasons == ["closed"]
