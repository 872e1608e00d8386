"""Per-item tool metrics in the tensordict, episode ending, specs and rollouts."""

from __future__ import annotations

from typing import Any

import torch
from tensordict import TensorDict, TensorDictBase, lazy_stack
from torchrl.data.llm import History
from torchrl.envs import TransformedEnv
from torchrl.envs.llm import ChatEnv

from toolservices.torchrl import (
    END_REASON_FAILURES,
    METRICS_KEY,
    ExecuteToolsInOrder,
    SimpleToolTransform,
    ToolRegistry,
    ToolTransformBase,
)


def ok(x: int) -> int:
    """Returns x."""
    return x


def bad(x: int) -> int:
    """Always fails."""
    raise ValueError("nope")


CALL_OK = '<tool name="ok">{"x": 1}</tool>'
CALL_BAD = '<tool name="bad">{"x": 1}</tool>'
MALFORMED = '<tool name="ok">{"x": 1}'  # never closed: a parse error


def test_metrics_written_per_item(chat: Any) -> None:
    driver = chat(ExecuteToolsInOrder(ToolRegistry([ok, bad]), "xml_block", timeout=5.0), 4)
    driver.step([CALL_OK + CALL_BAD, "no calls", MALFORMED, CALL_OK + CALL_OK])
    assert METRICS_KEY == "tool_metrics"
    assert driver.metric("calls") == [2, 0, 0, 2]
    assert driver.metric("failed_calls") == [1, 0, 0, 0]
    assert driver.metric("parse_errors") == [0, 0, 1, 0]
    assert driver.metric("timeouts") == [0, 0, 0, 0]
    assert driver.metric("failed_turns") == [0, 0, 1, 0]
    tool_time = driver.metric("tool_time")
    assert tool_time[1] == 0 and tool_time[0] >= 0
    assert list(driver.last[METRICS_KEY, "end_reason"]) == ["", "", "", ""]


def test_max_failed_turns_ends_only_that_items_episode(chat: Any) -> None:
    driver = chat(ExecuteToolsInOrder(ToolRegistry([ok, bad]), "xml_block", max_failed_turns=2), 3)
    driver.step([CALL_BAD, MALFORMED, CALL_BAD])
    assert driver.done() == [False, False, False]
    driver.step([CALL_BAD, MALFORMED, CALL_OK + CALL_BAD])  # item 2: partly ok resets
    assert driver.done() == [True, True, False]
    assert driver.last["terminated"].view(-1).tolist() == [True, True, False]
    reasons = list(driver.last[METRICS_KEY, "end_reason"])
    assert reasons == [END_REASON_FAILURES, END_REASON_FAILURES, ""]
    assert driver.metric("failed_turns") == [2, 2, 0]
    # a reset of the ended items starts their count again
    driver.reset_items([True, True, False])
    driver.step([CALL_BAD, CALL_OK, CALL_BAD])
    assert driver.metric("failed_turns") == [1, 0, 1]
    assert driver.done() == [False, False, False]


def test_turn_without_calls_breaks_the_streak(chat: Any) -> None:
    driver = chat(ExecuteToolsInOrder(ToolRegistry([bad]), "xml_block", max_failed_turns=2), 1)
    driver.step([CALL_BAD])
    driver.step(["let me think"])
    driver.step([CALL_BAD])
    assert driver.done() == [False]


def test_two_tool_transforms_add_their_metrics(chat: Any) -> None:
    transforms = [
        ExecuteToolsInOrder(ToolRegistry([ok]), "xml_block"),
        SimpleToolTransform({"ok": ok}),
    ]
    driver = chat(transforms, 2)
    driver.step([CALL_OK + '<tool>ok\n{"x": 2}</tool>', "<tool>nope\n{}</tool>"])
    assert driver.metric("calls") == [2, 1]
    assert driver.metric("failed_calls") == [0, 1]


def test_observation_spec_declares_the_metrics() -> None:
    env = TransformedEnv(ChatEnv(batch_size=(3,)), ExecuteToolsInOrder(ToolRegistry([ok])))
    spec = env.observation_spec[METRICS_KEY]
    assert set(spec.keys()) >= {"calls", "failed_calls", "parse_errors", "timeouts", "tool_time"}
    assert spec["calls"].shape == torch.Size([3])
    reset = env.reset(TensorDict(query=["a", "b", "c"], batch_size=(3,)))
    assert reset[METRICS_KEY, "calls"].tolist() == [0, 0, 0]


def test_rollout_with_a_scripted_policy() -> None:
    turns = iter(
        [
            [CALL_OK, "thinking"],
            ['<tool name="ok">{"x": 5}</tool>', CALL_OK],
            ["final answer", "final answer"],
        ]
    )

    def policy(td: TensorDictBase) -> TensorDictBase:
        history = td["history"]
        texts = next(turns)
        response = lazy_stack([History(role="assistant", content=t).unsqueeze(0) for t in texts])
        history.full = history.prompt.extend(response, inplace=False, dim=-1)
        history.response = response
        td["history"] = history
        return td

    env = TransformedEnv(ChatEnv(batch_size=(2,)), ExecuteToolsInOrder(ToolRegistry([ok])))
    start = env.reset(TensorDict(query=["q0", "q1"], batch_size=(2,)))
    rollout = env.rollout(3, policy, tensordict=start, auto_reset=False)
    assert rollout.shape == torch.Size([2, 3])
    calls = rollout["next", METRICS_KEY, "calls"]
    assert calls.tolist() == [[1, 1, 0], [0, 1, 0]]
    final = rollout[:, -1]["next", "history"].prompt.tolist()
    assert [m["role"] for m in final[0] if m["role"] != "<none>"] == [
        "user",
        "assistant",
        "tool",
        "assistant",
        "tool",
        "assistant",
    ]


def test_torchrl_style_subclass_still_works(chat: Any) -> None:
    class Calculator(ToolTransformBase):
        tool_role = "calculator"

        def _process_batch_item(self, content: str, index: int) -> list[str] | None:
            return ["2+2=4"] if "2+2" in content else None

        def _format_result(self, result: str) -> str:
            return f"[{result}]"

    driver = chat(Calculator(), 2)
    driver.step(["what is 2+2", "hello"])
    assert driver.messages_after_last_assistant(0)[0]["content"] == "[2+2=4]"
    assert driver.roles(0)[-1] == "calculator" and driver.roles(1)[-1] == "<none>"
    assert driver.metric("calls") == [1, 0]
