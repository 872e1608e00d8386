"""Episode modes: ``parser=None`` (server-parsed calls only), ``aclose(reason=...)``,
and the batch path of ToolEnv keeping the per-episode guarantees."""

from __future__ import annotations

from typing import Any

import anyio
import pytest
from tests._chat import add, hermes
from tests._chat import server_call as _server_call

from toolservices import Dispatcher, Episode, ToolEnv, ToolRegistry, UserError, tool
from toolservices.env.episode import CLOSE_REASONS, EndReason

HERMES = hermes("add", {"a": 1, "b": 2})


def server_call(args: dict[str, Any] | str, call_id: str = "call_srv_1") -> dict[str, Any]:
    return _server_call(call_id, "add", args)


# -- parser=None -----------------------------------------------------------------------


async def test_parser_none_runs_the_server_calls_only() -> None:
    episode = Episode([add], parser=None, max_turns=None)
    message = {
        "role": "assistant",
        "content": "adding",
        "tool_calls": [server_call({"a": 2, "b": 3})],
    }
    (result,) = await episode.astep(message)
    assert result == {"role": "tool", "tool_call_id": "call_srv_1", "name": "add", "content": "5"}
    assert episode.messages[-2]["tool_calls"][0]["id"] == "call_srv_1"
    assert not episode.done and episode.metrics.calls == 1


async def test_parser_none_never_parses_the_text() -> None:
    episode = Episode([add], parser=None)
    # a text that any text parser would run as a call: here it is the answer
    assert await episode.astep(HERMES) == []
    assert episode.done and episode.reason == "answered"
    assert episode.metrics.calls == 0 and episode.metrics.parse_errors == 0
    assert episode.messages[-1] == {"role": "assistant", "content": HERMES}
    # a message dict without tool_calls: its content is not parsed either
    other = Episode([add], parser=None)
    assert await other.astep({"role": "assistant", "content": HERMES, "tool_calls": []}) == []
    assert other.reason == "answered" and other.metrics.calls == 0


async def test_parser_none_text_is_never_a_parse_error() -> None:
    """A long answer, or one holding a lone surrogate, is an answer, not a failed turn.

    (The rollout's former workaround parser refused text over max_chars and
    text with lone surrogates with a parse error.)
    """
    for text in ("x" * 17_000_000, "half a pair: \ud800 ok"):
        episode = Episode([add], parser=None, max_failed_turns=1)
        assert await episode.astep({"role": "assistant", "content": text}) == []
        assert episode.reason == "answered"
        assert episode.metrics.parse_errors == 0


async def test_parser_none_still_checks_server_calls() -> None:
    episode = Episode([add], parser=None, max_turns=None)
    bad = {"role": "assistant", "content": "", "tool_calls": [server_call("{not json")]}
    messages = await episode.astep(bad)
    assert len(messages) == 1 and "Could not read the tool call" in messages[0]["content"]
    assert episode.metrics.parse_errors == 1 and not episode.done
    assert episode.parser.name == "server"


def test_parser_none_in_toolenv() -> None:
    env = ToolEnv([add], parser=None)
    env.reset(["a", "b"])
    call = {"role": "assistant", "content": "", "tool_calls": [server_call({"a": 4, "b": 5})]}
    step = env.step([call, HERMES])
    assert step.tool_messages[0][0]["content"] == "9"
    assert step.tool_messages[1] == [] and step.reasons == [None, "answered"]


# -- aclose(reason=...) ----------------------------------------------------------------


async def test_aclose_reason_is_the_running_episodes_reason() -> None:
    assert set(CLOSE_REASONS) <= set(EndReason.__args__)
    for reason in CLOSE_REASONS:
        episode = Episode([add])
        await episode.astep(HERMES)
        await episode.aclose(reason=reason)
        assert episode.done and episode.closed and episode.reason == reason
        await episode.aclose(reason="closed")  # the first close wins
        assert episode.reason == reason


async def test_aclose_reason_keeps_a_finished_episodes_reason() -> None:
    episode = Episode([add])
    await episode.astep("the answer is 3")
    await episode.aclose(reason="request_error")
    assert episode.reason == "answered" and episode.closed


async def test_aclose_rejects_unknown_reasons() -> None:
    episode = Episode([add])
    with pytest.raises(UserError, match="valid: 'closed', 'request_error', 'infrastructure_error'"):
        await episode.aclose(reason="answered")
    assert not episode.closed and not episode.done


# -- ToolEnv's batch path --------------------------------------------------------------


def test_toolenv_batch_keeps_ids_state_and_streaks() -> None:
    seen: list[dict[str, Any]] = []

    @tool
    def probe(_state: dict[str, Any]) -> str:
        """Records its state."""
        seen.append(_state)
        return "ok"

    env = ToolEnv([probe], max_failed_turns=2, max_turns=3)
    env.reset(["a", "b", "c"])
    call = '<tool_call>\n{"name": "probe", "arguments": {}}\n</tool_call>'
    broken = '<tool_call>\n{"name": "nope", "arguments": {}}\n</tool_call>'
    env.step([call, broken, "done"])
    step = env.step([call, broken, None])
    assert step.reasons == [None, "too_many_failures", None]
    assert step.done == [False, True, True]
    assert [(s["batch_index"], s["turn"], s["call_index"]) for s in seen] == [(0, 1, 0), (0, 2, 0)]
    assert seen[0]["episode_id"] == env.episodes[0].id
    for messages in env.messages[:2]:
        assistant, tool_message = messages[-2:]
        assert assistant["tool_calls"][0]["id"] == tool_message["tool_call_id"]
    with pytest.raises(UserError, match="done"):
        env.episodes[1]._begin_turn(call)


def test_toolenv_bad_response_raises_before_any_call_runs() -> None:
    ran: list[int] = []

    @tool
    def mark() -> str:
        """Marks."""
        ran.append(1)
        return "ok"

    env = ToolEnv([mark])
    env.reset(["a", "b"])
    call = '<tool_call>\n{"name": "mark", "arguments": {}}\n</tool_call>'
    with pytest.raises(UserError, match="got int"):
        env.step([call, 7])
    assert ran == [] and [e.turns for e in env.episodes] == [0, 0]
    assert not any(e._busy for e in env.episodes)


async def test_shared_limiter_fast_path_keeps_the_bound() -> None:
    """Free tokens are taken without yielding; a full bound still makes calls wait."""
    inside = 0
    peak = 0
    gate = anyio.Event()

    @tool
    async def slow() -> str:
        """Waits for the gate."""
        nonlocal inside, peak
        inside += 1
        peak = max(peak, inside)
        await gate.wait()
        inside -= 1
        return "ok"

    shared = Dispatcher(ToolRegistry([slow]), max_concurrency=2)
    episodes = [Episode(shared.registry, dispatcher=shared) for _ in range(5)]
    call = '<tool_call>\n{"name": "slow", "arguments": {}}\n</tool_call>'
    async with anyio.create_task_group() as tg:
        for episode in episodes:
            tg.start_soon(episode.astep, call)
        await anyio.wait_all_tasks_blocked()  # every step is in the tool or at the limiter
        assert inside == 2
        gate.set()
    assert peak == 2 and all(e.last is not None and e.last.results[0].ok for e in episodes)


async def test_a_cancelled_toolenv_step_leaves_the_batch_as_it_was() -> None:
    started = anyio.Event()

    @tool
    async def hang() -> str:
        """Never returns on its own."""
        started.set()
        await anyio.sleep_forever()
        return "never"

    env = ToolEnv([hang], timeout=None)
    env.reset(["a", "b"])
    before = [list(m) for m in env.messages]
    call = '<tool_call>\n{"name": "hang", "arguments": {}}\n</tool_call>'
    async with anyio.create_task_group() as tg:
        tg.start_soon(env.astep, [call, call])
        await started.wait()
        tg.cancel_scope.cancel()
    assert env.messages == before
    assert [e.turns for e in env.episodes] == [0, 0]
    assert not any(e._busy or e.done for e in env.episodes)
    step = await env.astep(["bye", "bye"])  # usable again
    assert step.reasons == ["answered", "answered"]


async def test_closing_many_episodes_closes_all_and_raises_one_failure() -> None:
    """Fault injection: an executor whose session release fails for one episode (cannot
    happen on demand). Every episode is still closed and the others' sessions released,
    and the caller gets that one InfrastructureError, not an exception group."""
    from toolservices.errors import ServiceUnavailableError

    released: list[str] = []

    class HalfBrokenExecutor:
        timeout = 5.0

        async def aclose_session(self, session_id: str) -> bool:
            if not released:
                released.append("failed")
                raise ServiceUnavailableError("the interpreter host is gone")
            released.append(session_id)
            return True

    env = ToolEnv([add], python=HalfBrokenExecutor())  # type: ignore[arg-type]
    env.reset(["a", "b", "c"])
    with pytest.raises(ServiceUnavailableError, match="host is gone"):
        await env.aclose()
    assert all(e.closed and e.reason == "closed" for e in env.episodes)
    assert len(released) == 3  # one failure, two sessions released
