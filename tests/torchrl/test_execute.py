"""ExecuteToolsInOrder on real ChatEnvs: contract text, padding, order, concurrency, state."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from tensordict import TensorDict, lazy_stack
from torchrl.data.llm import History
from torchrl.envs import TransformedEnv
from torchrl.envs.llm import ChatEnv
from torchrl.envs.llm.transforms import ExecuteToolsInOrder as TorchRLExecute
from torchrl.envs.llm.transforms import ToolRegistry as TorchRLRegistry
from torchrl.envs.llm.transforms import XMLBlockParser as TorchRLXMLParser

from toolservices.torchrl import (
    ExecuteToolsInOrder,
    JSONCallParser,
    ToolRegistry,
    XMLBlockParser,
    history_to_messages,
)


class Add:
    name = "add"
    schema_in = {"a": int, "b": int}
    schema_out = {"sum": int}

    def __call__(self, a: int, b: int, **kwargs: object) -> dict[str, int]:
        return {"sum": a + b}


class Search:
    name = "search"
    schema_in = {"query": str}
    schema_out = {"results": list}

    def __call__(self, query: str, **kwargs: object) -> dict[str, object]:
        return {"results": [query.upper()], "n": 1}


class Failing:
    name = "failing"
    schema_in: dict[str, object] = {}
    schema_out: dict[str, object] = {}

    def __call__(self, **kwargs: object) -> dict[str, object]:
        raise ValueError("boom")


SAME_INPUTS = [
    '<tool name="add">{"a": 1, "b": 2}</tool> then '
    '<tool name="search" tag="A">{"query": "x"}</tool>',
    "no call here",
    '<tool name="search">{"query": "torchrl"}</tool><tool name="failing">{}</tool>',
    '<tool name="add">{"a": 5, "b": -5}</tool>',
]


def test_same_text_as_torchrl_on_the_same_inputs(chat: Any) -> None:
    registry = ToolRegistry([Add(), Search(), Failing()])
    ours = chat(ExecuteToolsInOrder(registry, XMLBlockParser()), 4)
    theirs = chat(
        TorchRLExecute(TorchRLRegistry([Add(), Search(), Failing()]), TorchRLXMLParser()), 4
    )
    ours.step(SAME_INPUTS)
    theirs.step(SAME_INPUTS)
    for i in range(4):
        assert ours.roles(i) == theirs.roles(i)
        assert ours.contents(i) == theirs.contents(i)
    assert ours.roles(1)[-1] == "<none>"
    assert ours.tool_texts(0)[0].startswith("<tool_results>\nTool add (call 1) succeeded:\n")
    assert "Tool search (call 2) [tag: A] succeeded:" in ours.tool_texts(0)[0]


def test_calls_run_in_order_of_appearance(chat: Any) -> None:
    seen: list[str] = []

    def record(label: str) -> str:
        """Remember the label."""
        seen.append(label)
        return label

    driver = chat(ExecuteToolsInOrder(ToolRegistry([record]), "xml_block"), 1)
    labels = ["c", "a", "b", "e", "d"]
    driver.step(["".join(f'<tool name="record">{{"label": "{x}"}}</tool>' for x in labels)])
    assert seen == labels
    text = driver.tool_texts(0)[0]
    assert [text.index(f"(call {n})") for n in range(1, 6)] == sorted(
        text.index(f"(call {n})") for n in range(1, 6)
    )


def test_batch_items_run_concurrently_with_blocking_tools(chat: Any) -> None:
    barrier = threading.Barrier(4, timeout=10)

    def meet(x: int) -> int:
        """Returns only once four calls are running at the same time."""
        barrier.wait()
        return x

    driver = chat(ExecuteToolsInOrder(ToolRegistry([meet]), "xml_block"), 4)
    driver.step([f'<tool name="meet">{{"x": {i}}}</tool>' for i in range(4)])
    for i in range(4):
        assert "succeeded" in driver.tool_texts(i)[0]


def test_state_only_for_tools_that_accept_it(chat: Any) -> None:
    states: list[dict[str, Any]] = []

    def plain(x: int) -> int:
        """No state parameter: TorchRL would pass _state and fail."""
        return x

    def stateful(x: int, _state: dict[str, Any]) -> int:
        """Receives the state."""
        states.append(_state)
        return x

    driver = chat(ExecuteToolsInOrder(ToolRegistry([plain, stateful]), "xml_block"), 2)
    call = '<tool name="plain">{"x": 1}</tool><tool name="stateful">{"x": 2}</tool>'
    driver.step([call, call])
    driver.step([call, "done"])
    for i in range(2):
        assert "failed" not in driver.contents(i)[3]
    by_turn = sorted((s["turn"], s["batch_index"]) for s in states)
    assert by_turn == [(1, 0), (1, 1), (2, 0)]
    assert all(s["call_index"] == 1 for s in states)
    assert len({s["session_id"] for s in states}) == 2


def test_state_writes_persist_per_item_until_its_reset(chat: Any) -> None:
    def count(_state: dict[str, Any]) -> int:
        """Counts this item's calls in its state; the context entries stay as they were."""
        _state["n"] = _state.get("n", 0) + 1
        _state["batch_index"] = -1  # context: not the tool's to change
        return _state["n"]

    driver = chat(ExecuteToolsInOrder(ToolRegistry([count]), "xml_block"), 2)
    call = '<tool name="count">{}</tool>'
    driver.step([call, call])
    driver.step([call + call, "done"])
    (block,) = driver.tool_texts(0)  # item 0's second turn: its calls 2 and 3
    assert "Result: 2" in block and "Result: 3" in block
    driver.reset_items([True, False])
    driver.step([call, call])
    assert "Result: 1" in driver.tool_texts(0)[0]  # the reset item starts afresh
    assert "Result: 2" in driver.tool_texts(1)[0]  # the other keeps counting
    states = [episode.state for episode in driver.env.transform[0]._episodes]
    assert states == [{"n": 1}, {"n": 2}]


def test_pass_state_false_gives_no_state(chat: Any) -> None:
    got: list[object] = []

    class Service:
        name = "svc"
        schema_in: dict[str, object] = {}
        schema_out: dict[str, object] = {}

        def __call__(self, **kwargs: object) -> dict[str, object]:
            got.append(kwargs.get("_state"))
            return {}

    driver = chat(ExecuteToolsInOrder(ToolRegistry([Service()]), "xml_block", False, False), 1)
    driver.step(['<tool name="svc"></tool>'])
    assert got == [None]


def test_stop_on_error_skips_later_calls(chat: Any) -> None:
    driver = chat(ExecuteToolsInOrder(ToolRegistry([Add(), Failing()]), "xml_block", True), 1)
    driver.step(['<tool name="failing"></tool><tool name="add">{"a": 1, "b": 1}</tool>'])
    text = driver.tool_texts(0)[0]
    assert "Tool failing (call 1) failed:\n  Error: boom" in text
    assert "Tool add (call 2) failed" in text and '"sum"' not in text


def test_failures_never_raise_out_of_step(chat: Any) -> None:
    def crash() -> None:
        """Raises a non-ToolError."""
        raise RuntimeError("kaboom")

    class NotJSON:
        name = "odd"
        schema_in: dict[str, object] = {}
        schema_out: dict[str, object] = {}

        def __call__(self, **kwargs: object) -> object:
            return object()  # TorchRL: TypeError when it writes _tool into it

    driver = chat(ExecuteToolsInOrder(ToolRegistry([crash, NotJSON()]), "xml_block"), 3)
    driver.step(
        [
            '<tool name="crash"></tool>',
            '<tool name="missing">{"x": 1}</tool><tool name="odd"></tool>',
            '<tool name="crash">{not json</tool>',
        ]
    )
    assert "Error: kaboom" in driver.tool_texts(0)[0]
    assert "Unknown tool: missing" in driver.tool_texts(1)[0]
    assert "Tool odd (call 2) succeeded" in driver.tool_texts(1)[0]
    assert "failed" in driver.tool_texts(2)[0]


@pytest.mark.parametrize("batch_size", [1, 2, 3, 5, 8])
def test_multi_turn_history_grows_and_stays_rectangular(chat: Any, batch_size: int) -> None:
    driver = chat(ExecuteToolsInOrder(ToolRegistry([Add()]), "xml_block"), batch_size)
    expected_len = 1
    for turn in range(3):
        texts = [
            f'<tool name="add">{{"a": {i}, "b": {turn}}}</tool>' if (i + turn) % 2 else "thinking"
            for i in range(batch_size)
        ]
        driver.step(texts)
        any_calls = any((i + turn) % 2 for i in range(batch_size))
        expected_len += 1 + (1 if any_calls else 0)
        conversations = driver.conversations()
        assert {len(c) for c in conversations} == {expected_len}
        for i in range(batch_size):
            appended = driver.messages_after_last_assistant(i)
            if (i + turn) % 2:
                assert [m["role"] for m in appended] == ["tool"]
                assert f'"sum": {i + turn}' in appended[0]["content"]
            elif any_calls:
                assert appended == [{"role": "<none>", "content": "", "is_complete": True}]
    # the conversation without padding is what a chat template sees
    clean = history_to_messages(driver.td["history"].prompt)
    assert all(m["role"] != "<none>" for c in clean for m in c)


def test_openai_result_format_one_message_per_call_with_ids(chat: Any) -> None:
    driver = chat(
        ExecuteToolsInOrder(
            ToolRegistry([Add(), Failing()]),
            "hermes",
            result_format="openai",
            record_call_ids=True,
        ),
        2,
    )
    driver.step(
        [
            '<tool_call>{"name": "add", "arguments": {"a": 1, "b": 2}}</tool_call>\n'
            '<tool_call>{"name": "failing", "arguments": {}}</tool_call>',
            "plain answer",
        ]
    )
    appended = driver.messages_after_last_assistant(0)
    assert [m["role"] for m in appended] == ["tool", "tool"]
    assert appended[0]["content"] == '{\n  "sum": 3\n}'
    assert appended[1]["content"] == "Error: ValueError: boom"
    ids = [m["tool_calls"][0]["id"] for m in appended]
    assert len(set(ids)) == 2 and all(ids)
    assert driver.roles(1)[-2:] == ["<none>", "<none>"]
    messages = history_to_messages(driver.td["history"].prompt)[0]
    assert messages[-2]["tool_call_id"] == ids[0] and messages[-2]["name"] == "add"


def test_default_messages_keep_dense_extend_working(chat: Any) -> None:
    """TransformersWrapper builds history.full with a dense extend: keys must match."""
    driver = chat(ExecuteToolsInOrder(ToolRegistry([Add()]), "hermes", result_format="openai"), 1)
    driver.step(['<tool_call>{"name": "add", "arguments": {"a": 1, "b": 2}}</tool_call>'])
    prompt = driver.td["history"].prompt
    response = prompt[..., -1:]
    full = prompt.extend(response, inplace=False, dim=-1)
    assert full.shape[-1] == prompt.shape[-1] + 1
    assert "tool_calls" not in driver.messages_after_last_assistant(0)[0]


def test_no_calls_anywhere_leaves_history_unchanged(chat: Any) -> None:
    driver = chat(ExecuteToolsInOrder(ToolRegistry([Add()]), "xml_block"), 3)
    driver.step(["a", "b", "c"])
    assert all(driver.roles(i) == ["user", "assistant"] for i in range(3))


def test_tool_specs_for_chat_templates() -> None:
    def lookup(city: str, days: int = 1) -> str:
        """Weather forecast.

        Args:
            city: Name of the city.
            days: How many days.
        """
        return city

    transform = ExecuteToolsInOrder(ToolRegistry([lookup]), "hermes")
    (spec,) = transform.tool_specs
    assert spec["function"]["name"] == "lookup"
    assert spec["function"]["parameters"]["properties"]["days"]["type"] == "integer"


def test_two_dimensional_batch() -> None:
    def add(a: int, b: int) -> int:
        """Add."""
        return a + b

    env = TransformedEnv(ChatEnv(batch_size=(2, 2)), ExecuteToolsInOrder(ToolRegistry([add])))
    td = env.reset(TensorDict(query=[["a", "b"], ["c", "d"]], batch_size=(2, 2)))
    texts = [['<tool name="add">{"a": 1, "b": 2}</tool>', "x"], ["y", '<tool name="add">{}</tool>']]
    history = td["history"]
    response = lazy_stack(
        [
            lazy_stack([History(role="assistant", content=t).unsqueeze(0) for t in row])
            for row in texts
        ]
    )
    history.full = history.prompt.extend(response, inplace=False, dim=-1)
    history.response = response
    td["history"] = history
    out = env.step(td)["next"]
    conversations = out["history"].prompt.tolist()
    assert conversations[0][0][-1]["content"].endswith("Result: 3\n</tool_results>")
    assert conversations[0][1][-1]["role"] == "<none>"
    assert conversations[1][1][-1]["content"].startswith(
        "<tool_results>\nTool add (call 1) failed:"
    )
    assert out["tool_metrics", "calls"].tolist() == [[1, 0], [0, 1]]
    assert out["tool_metrics", "failed_calls"].tolist() == [[0, 0], [0, 1]]


def test_foreign_parsers_and_json_envelope(chat: Any) -> None:
    """TorchRL's own parser object still works; so does the JSON envelope parser."""
    registry = ToolRegistry([Add()])
    theirs = chat(ExecuteToolsInOrder(registry, TorchRLXMLParser()), 1)
    theirs.step(['<tool name="add" tag="t">{"a": 2, "b": 2}</tool>'])
    assert "Tool add (call 1) [tag: t] succeeded:" in theirs.tool_texts(0)[0]

    envelope = chat(ExecuteToolsInOrder(registry, JSONCallParser()), 1)
    envelope.step(['{"message": "adding", "tools": [{"tool": "add", "args": {"a": 1, "b": 1}}]}'])
    assert '"sum": 2' in envelope.tool_texts(0)[0]


def test_a_raising_custom_parser_is_a_parse_error(chat: Any) -> None:
    def broken(text: str) -> dict[str, Any]:
        raise ValueError("cannot read this")

    driver = chat(ExecuteToolsInOrder(ToolRegistry([Add()]), broken), 1)
    driver.step(["anything"])
    assert "cannot read this" in driver.tool_texts(0)[0]
    assert driver.metric("parse_errors") == [1]


def test_call_ids_over_turns_with_per_item_appends() -> None:
    """record_call_ids with a policy that appends per item, as TorchRL's vLLM wrapper does."""

    def add(a: int, b: int) -> int:
        """Add."""
        return a + b

    transform = ExecuteToolsInOrder(
        ToolRegistry([add]), "hermes", result_format="openai", record_call_ids=True
    )
    env = TransformedEnv(ChatEnv(batch_size=(2,)), transform)
    td = env.reset(TensorDict(query=["q0", "q1"], batch_size=(2,)))
    call = '<tool_call>{"name": "add", "arguments": {"a": %d, "b": 1}}</tool_call>'
    for turn in range(3):
        history = td["history"]
        texts = [call % turn, "thinking" if turn % 2 else call % (10 + turn)]
        responses = [History(role="assistant", content=t) for t in texts]
        history.full = lazy_stack(
            [
                prompt.append(response, inplace=False, dim=-1)
                for prompt, response in zip(history.prompt.unbind(0), responses, strict=True)
            ]
        )
        history.response = lazy_stack([r.unsqueeze(0) for r in responses])
        td["history"] = history
        td = env.step(td)["next"].exclude("done", "terminated")
    conversations = history_to_messages(td["history"].prompt)
    tool_messages = [m for m in conversations[0] if m["role"] == "tool"]
    assert [m["content"] for m in tool_messages] == ["1", "2", "3"]
    assert all(m["tool_call_id"].startswith("call_") for m in tool_messages)
    assert len({m["tool_call_id"] for m in tool_messages}) == 3
    assert [m["role"] for m in conversations[1]].count("tool") == 2


def test_recorded_call_ids_are_the_result_ids_even_without_parser_ids() -> None:
    """A custom parser may return calls without ids: history records the dispatcher's id."""
    from toolservices.parsing import ParseResult, ToolCall

    def add(a: int, b: int) -> int:
        """Add."""
        return a + b

    def bare(text: str) -> ParseResult:
        return ParseResult(text="", calls=[ToolCall("add", {"a": 1, "b": 2})])

    transform = ExecuteToolsInOrder(
        ToolRegistry([add]), bare, result_format="openai", record_call_ids=True
    )
    env = TransformedEnv(ChatEnv(batch_size=(1,)), transform)
    td = env.reset(TensorDict(query=["q"], batch_size=(1,)))
    history = td["history"]
    response = History(role="assistant", content="add please").unsqueeze(0)
    history.full = lazy_stack([history.prompt[0].append(response[0], inplace=False, dim=-1)])
    history.response = lazy_stack([response])
    td["history"] = history
    td = env.step(td)["next"]
    (message,) = [m for m in history_to_messages(td["history"].prompt)[0] if m["role"] == "tool"]
    assert message["content"] == "3"
    assert message["tool_call_id"].startswith("call_")
    assert transform._episodes[0].last.results[0].call_id == message["tool_call_id"]
