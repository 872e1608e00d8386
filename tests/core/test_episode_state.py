"""``_state`` in an episode: what tools write to the episode's keys persists, per episode."""

from __future__ import annotations

from typing import Any

import anyio
import pytest
from tests._chat import hermes

from toolservices import Dispatcher, Episode, ToolEnv, ToolRegistry, tool
from toolservices.parsing import ToolCall


def calls(*pairs: tuple[str, dict[str, Any]]) -> str:
    return "".join(hermes(name, args) for name, args in pairs)


@tool
def remember(key: str, value: str, _state: dict[str, Any]) -> str:
    """Store a value in the episode state.

    Args:
        key: Where.
        value: What.
    """
    _state[key] = value
    return "stored"


@tool
def recall(key: str, _state: dict[str, Any]) -> str:
    """Read a value from the episode state.

    Args:
        key: Where.
    """
    return str(_state.get(key, "<nothing>"))


@tool
def forget(key: str, _state: dict[str, Any]) -> str:
    """Remove a value from the episode state.

    Args:
        key: Where.
    """
    del _state[key]
    return "forgotten"


TOOLS = [remember, recall, forget]


def texts(messages: list[dict[str, Any]]) -> list[str]:
    return [m["content"] for m in messages]


async def test_writes_persist_for_later_turns_of_the_episode() -> None:
    episode = Episode(TOOLS, end_on_answer=False, state={"user": "alice"})
    await episode.astep(calls(("remember", {"key": "plan", "value": "A"})))
    assert episode.state == {"user": "alice", "plan": "A"}
    assert texts(await episode.astep(calls(("recall", {"key": "plan"})))) == ["A"]
    await episode.astep(calls(("remember", {"key": "plan", "value": "B"})))
    await episode.astep(calls(("forget", {"key": "user"})))
    assert episode.state == {"plan": "B"}


async def test_a_later_call_of_the_same_response_sees_the_write() -> None:
    episode = Episode(TOOLS)
    out = await episode.astep(
        calls(("remember", {"key": "k", "value": "v"}), ("recall", {"key": "k"}))
    )
    assert texts(out) == ["stored", "v"]


async def test_never_across_episodes() -> None:
    a = Episode(TOOLS, episode_id="same")
    b = Episode(TOOLS, episode_id="same")
    await a.astep(calls(("remember", {"key": "k", "value": "a"})))
    assert texts(await b.astep(calls(("recall", {"key": "k"})))) == ["<nothing>"]
    assert b.state == {} and a.state == {"k": "a"}


async def test_standard_entries_are_not_the_tools_to_change() -> None:
    seen: list[dict[str, Any]] = []

    @tool
    def meddle(_state: dict[str, Any]) -> str:
        """Overwrites the standard entries."""
        seen.append(dict(_state))
        _state.update(turn=99, episode_id="forged", call_index=7, python_session="x")
        del _state["turn"]
        return "ok"

    episode = Episode([meddle], episode_id="ep", end_on_answer=False)
    await episode.astep(calls(("meddle", {}), ("meddle", {})))
    await episode.astep(calls(("meddle", {})))
    assert episode.state == {}
    standard = [(s["episode_id"], s["turn"], s["call_index"]) for s in seen]
    assert standard == [("ep", 1, 0), ("ep", 1, 1), ("ep", 2, 0)]


async def test_a_user_key_named_like_a_standard_one_is_kept() -> None:
    @tool
    def peek(_state: dict[str, Any]) -> str:
        """Returns the turn it sees."""
        return str(_state["turn"])

    episode = Episode([peek], state={"turn": "mine"})
    assert texts(await episode.astep(calls(("peek", {})))) == ["1"]  # the standard entry wins
    assert episode.state == {"turn": "mine"}  # and the user's value is not lost


async def test_a_failing_call_keeps_its_writes_a_timed_out_one_does_not() -> None:
    @tool
    def write_then_fail(_state: dict[str, Any]) -> str:
        """Writes, then raises."""
        _state["failed_write"] = True
        raise ValueError("boom")

    @tool
    async def write_then_hang(_state: dict[str, Any]) -> str:
        """Writes, then never returns."""
        _state["hung_write"] = True
        await anyio.sleep_forever()
        return "unreachable"

    episode = Episode([write_then_fail, write_then_hang], timeout=0.2, end_on_answer=False)
    await episode.astep(calls(("write_then_fail", {})))
    assert episode.last is not None and episode.last.results[0].error_kind == "tool_failed"
    await episode.astep(calls(("write_then_hang", {})))
    assert episode.last is not None and episode.last.results[0].error_kind == "timeout"
    assert episode.state == {"failed_write": True}


async def test_forks_write_to_their_own_copies() -> None:
    parent = Episode(TOOLS, end_on_answer=False, state={"log": ["base"]})
    await parent.astep(calls(("remember", {"key": "k", "value": "parent"})))
    left, right = await parent.afork(2)
    await left.astep(calls(("remember", {"key": "k", "value": "left"})))
    assert texts(await right.astep(calls(("recall", {"key": "k"})))) == ["parent"]
    assert (parent.state["k"], left.state["k"], right.state["k"]) == ("parent", "left", "parent")
    assert left.state["log"] is not parent.state["log"]


async def test_shared_dispatcher_keeps_each_episodes_writes_apart() -> None:
    shared = Dispatcher(ToolRegistry(TOOLS), max_concurrency=2)
    episodes = [Episode(TOOLS, dispatcher=shared) for _ in range(4)]
    async with anyio.create_task_group() as tg:
        for n, episode in enumerate(episodes):
            tg.start_soon(episode.astep, calls(("remember", {"key": "n", "value": str(n)})))
    assert [e.state for e in episodes] == [{"n": str(n)} for n in range(4)]


def test_toolenv_batches_persist_per_item() -> None:
    env = ToolEnv(TOOLS, max_turns=3)
    env.reset(["a", "b"])
    env.step([calls(("remember", {"key": "k", "value": "0"})), calls(("recall", {"key": "k"}))])
    step = env.step([calls(("recall", {"key": "k"})), calls(("recall", {"key": "k"}))])
    assert [texts(m) for m in step.tool_messages] == [["0"], ["<nothing>"]]
    assert [e.state for e in env.episodes] == [{"k": "0"}, {}]
    env.close()


def test_a_layers_context_is_read_only_for_tools() -> None:
    """ToolEnv's batch_index (like TorchRL's batch_index and session_id) is context:
    every call sees it, and a tool that overwrites or deletes it changes nothing."""
    seen: list[Any] = []

    @tool
    def meddle(_state: dict[str, Any]) -> str:
        """Reads, then tries to change, the batch index."""
        seen.append(_state["batch_index"])
        _state["batch_index"] = 99
        del _state["batch_index"]
        return "ok"

    env = ToolEnv([meddle], max_turns=3)
    env.reset(["a", "b"])
    env.step([calls(("meddle", {}), ("meddle", {})), calls(("meddle", {}))])
    env.step([calls(("meddle", {})), calls(("meddle", {}))])
    assert sorted(seen) == [0, 0, 0, 1, 1]
    assert [e.state for e in env.episodes] == [{}, {}]
    env.close()


def test_a_plain_dispatcher_still_gives_each_call_its_own_copy() -> None:
    state = {"user": "alice"}
    dispatcher = Dispatcher(ToolRegistry(TOOLS))
    [outcome] = dispatcher.run(
        [[ToolCall("remember", {"key": "k", "value": "v"}), ToolCall("recall", {"key": "k"})]],
        states=[state],
    )
    assert [r.value for r in outcome.results] == ["stored", "<nothing>"]
    assert state == {"user": "alice"}


@pytest.mark.parametrize("value", [None, 0, ""])
async def test_falsy_values_are_written_back(value: Any) -> None:
    @tool
    def put(_state: dict[str, Any]) -> str:
        """Stores a falsy value."""
        _state["v"] = value
        return "ok"

    episode = Episode([put], state={"v": "old"})
    await episode.astep(calls(("put", {})))
    assert episode.state == {"v": value}
