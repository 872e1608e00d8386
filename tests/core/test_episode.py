"""The per-episode core: independent stepping, state, Python sessions, fork, close."""

from __future__ import annotations

import threading
from collections.abc import AsyncIterator, Iterator
from typing import Any

import anyio
import pytest
from tests._chat import add, hermes

from toolservices import Dispatcher, Episode, ToolRegistry, UserError, python_tool, tool
from toolservices.python import PythonExecutorService


def py(code: str) -> str:
    return hermes("python", {"code": code})


@pytest.fixture(scope="module")
def executor() -> Iterator[PythonExecutorService]:
    svc = PythonExecutorService(pool_size=4, timeout=3.0, max_sessions=64)
    try:
        yield svc
    finally:
        svc.close()


@pytest.fixture
async def python_episode(executor: PythonExecutorService) -> AsyncIterator[Episode]:
    async with Episode([python_tool(executor)], python=executor) as episode:
        yield episode


async def test_step_appends_the_turn_and_returns_tool_messages() -> None:
    episode = Episode([add], prompt="2+3?", system_prompt="Use tools.")
    assert episode.messages == [
        {"role": "system", "content": "Use tools."},
        {"role": "user", "content": "2+3?"},
    ]
    assert episode.tool_specs[0]["function"]["name"] == "add"
    messages = await episode.astep(hermes("add", {"a": 2, "b": "3"}))
    (message,) = messages
    assert message["role"] == "tool" and message["content"] == "5" and message["name"] == "add"
    assistant = episode.messages[2]
    assert assistant["tool_calls"][0]["id"] == message["tool_call_id"]
    assert episode.messages[3] == message
    assert not episode.done and episode.turns == 1 and episode.last is not None
    assert await episode.astep("It is 5.") == []
    assert episode.done and episode.reason == "answered"
    assert episode.metrics.turns == 2 and episode.metrics.calls == 1
    with pytest.raises(UserError, match="done"):
        await episode.astep("again")


async def test_server_parsed_tool_calls_and_tool_results_format() -> None:
    episode = Episode([add], result_format="tool_results", max_turns=1)
    message = {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {"id": "srv-1", "type": "function", "function": {"name": "add", "arguments": "{}"}},
            {
                "id": "srv-2",
                "type": "function",
                "function": {"name": "add", "arguments": '{"a": 1, "b": 2}'},
            },
        ],
    }
    (result,) = await episode.astep(message)
    assert result["content"].startswith("<tool_results>\nTool add (call 1) failed:")
    assert "Tool add (call 2) succeeded:\n  Result: 3" in result["content"]
    assert [c["id"] for c in episode.messages[0]["tool_calls"]] == ["srv-1", "srv-2"]
    assert episode.done and episode.reason == "max_turns"


async def test_malformed_output_gives_parse_error_messages() -> None:
    episode = Episode([add], max_failed_turns=2)
    broken = '<tool_call>\n{"name": "add", "arguments": {"a": 1,\n</tool_call>'
    (message,) = await episode.astep(broken)
    assert message["role"] == "tool" and message["content"].startswith("Error: ")
    assert episode.metrics.parse_errors == 1 and not episode.done
    (message,) = await episode.astep(hermes("nope", {}))
    assert "Unknown tool: nope" in message["content"]
    assert episode.done and episode.reason == "too_many_failures"


async def test_a_hanging_tool_ends_with_a_timeout_result() -> None:
    release = threading.Event()

    @tool
    async def hang() -> str:
        """Never returns."""
        await anyio.sleep_forever()
        return "unreachable"

    @tool
    def block() -> str:
        """Blocks its thread until the test ends."""
        release.wait(60)
        return "late"

    episode = Episode([hang, block], timeout=0.2)
    try:
        first, second = await episode.astep(hermes("hang", {}) + hermes("block", {}))
    finally:
        release.set()
    for message, name in ((first, "hang"), (second, "block")):
        assert message["content"].startswith(f"Error: Tool '{name}' timed out after 0.2 s")
    assert episode.metrics.timeouts == 2 and not episode.done


async def test_step_while_stepping_raises() -> None:
    started, release = anyio.Event(), anyio.Event()

    @tool
    async def wait() -> str:
        """Waits for the test."""
        started.set()
        await release.wait()
        return "ok"

    episode = Episode([wait])
    async with anyio.create_task_group() as tg:
        tg.start_soon(episode.astep, hermes("wait", {}))
        await started.wait()
        with pytest.raises(UserError, match="still running"):
            await episode.astep("x")
        with pytest.raises(UserError, match="still running"):
            await episode.afork(2)
        release.set()
    assert episode.turns == 1


async def test_episodes_step_independently_under_one_bound() -> None:
    """Six episodes meet inside their tool calls: only possible if they run at once."""
    n = 6
    arrived, everyone = 0, anyio.Event()

    @tool
    async def meet() -> str:
        """Waits until every episode is inside this tool."""
        nonlocal arrived
        arrived += 1
        if arrived == n:
            everyone.set()
        await everyone.wait()
        return "met"

    shared = Dispatcher(ToolRegistry([meet]), max_concurrency=n)
    episodes = [Episode(shared.registry, dispatcher=shared, timeout=60) for _ in range(n)]
    outcomes: list[list[dict[str, Any]]] = [[] for _ in range(n)]

    async def drive(i: int) -> None:
        outcomes[i] = await episodes[i].astep(hermes("meet", {}))

    with anyio.fail_after(120):
        async with anyio.create_task_group() as tg:
            for i in range(n):
                tg.start_soon(drive, i)
    assert [m[0]["content"] for m in outcomes] == ["met"] * n


async def test_shared_dispatcher_bounds_all_episodes() -> None:
    active = peak = 0

    @tool
    async def work() -> str:
        """Holds a slot briefly."""
        nonlocal active, peak
        active += 1
        peak = max(peak, active)
        await anyio.sleep(0.05)
        active -= 1
        return "done"

    shared = Dispatcher(ToolRegistry([work]), max_concurrency=2)
    # different settings than the dispatcher: same bound, own dispatcher view
    episodes = [Episode([work], dispatcher=shared, timeout=30) for _ in range(6)]
    async with anyio.create_task_group() as tg:
        for episode in episodes:
            tg.start_soon(episode.astep, hermes("work", {}) + hermes("work", {}))
    assert peak == 2
    assert all(e.metrics.calls == 2 and e.metrics.failed_calls == 0 for e in episodes)


async def test_episodes_take_turns_independently_not_in_lockstep() -> None:
    """One episode runs three whole turns while five others are inside one tool call.

    The third turn's tool waits until all five are inside ``hold``, and ``hold``
    waits until that third turn is done: this completes only if the episodes
    overlap and none waits for the others' turns (in turn or in lockstep it
    deadlocks, and the 60 s bound fails the test).
    """
    n_short = 5
    inside, long_done = 0, anyio.Event()
    all_inside = anyio.Event()

    @tool
    def tick() -> str:
        """Returns at once."""
        return "tick"

    @tool
    async def gather() -> str:
        """Waits until every short episode is inside its call."""
        await all_inside.wait()
        long_done.set()
        return "gathered"

    @tool
    async def hold() -> str:
        """Waits, counted as inside, until the long episode has taken its three turns."""
        nonlocal inside
        inside += 1
        if inside == n_short:
            all_inside.set()
        await long_done.wait()
        return "held"

    shared = Dispatcher(ToolRegistry([tick, gather, hold]))
    long = Episode(shared.registry, dispatcher=shared, max_turns=10, timeout=60)
    shorts = [
        Episode(shared.registry, dispatcher=shared, max_turns=10, timeout=60)
        for _ in range(n_short)
    ]

    async def drive(episode: Episode, calls: list[str]) -> None:
        for name in calls:
            await episode.astep(hermes(name, {}))
        await episode.astep("finished")

    with anyio.fail_after(60):
        async with anyio.create_task_group() as tg:
            tg.start_soon(drive, long, ["tick", "tick", "gather"])
            for episode in shorts:
                tg.start_soon(drive, episode, ["hold"])
    assert all(e.reason == "answered" for e in [long, *shorts])
    assert long.turns == 4 and all(e.turns == 2 for e in shorts)
    assert long.metrics.failed_calls == 0 and all(e.metrics.failed_calls == 0 for e in shorts)


async def test_state_reaches_tools_and_stays_in_its_episode() -> None:
    seen: list[dict[str, Any]] = []

    @tool
    def record(_state: dict[str, Any]) -> str:
        """Records the call state."""
        seen.append(_state)
        _state["mutated"] = True  # persists in this episode only
        return "ok"

    a = Episode([record], state={"user": "a"}, episode_id="ep-a")
    b = Episode([record], state={"user": "b"})
    await a.astep(hermes("record", {}))
    await b.astep(hermes("record", {}))
    await a.astep(hermes("record", {}))
    assert [(s["episode_id"], s["user"], s["turn"]) for s in seen] == [
        ("ep-a", "a", 1),
        (b.id, "b", 1),
        ("ep-a", "a", 2),
    ]
    assert seen[0]["call_index"] == 0 and seen[0]["python_session"] is None
    assert a.state == {"user": "a", "mutated": True} and b.state == {"user": "b", "mutated": True}


async def test_python_state_is_per_episode(executor: PythonExecutorService) -> None:
    run = python_tool(executor)
    async with Episode([run]) as a, Episode([run]) as b:  # python= taken from the tool
        assert a.python is executor and a.python_session != b.python_session
        await a.astep(py("x = 41\nopen('note.txt', 'w').write('from a')"))
        (other,) = await b.astep(
            py("import os\nprint('x' in globals(), os.path.exists('note.txt'))")
        )
        assert other["content"] == "False False\n"
        (mine,) = await a.astep(py("print(x + 1, open('note.txt').read())"))
        assert mine["content"] == "42 from a\n"


async def test_python_errors_are_tool_messages(python_episode: Episode) -> None:
    (message,) = await python_episode.astep(py("raise ValueError('Test error')"))
    assert (
        message["content"].startswith("Error: ") and "ValueError: Test error" in message["content"]
    )
    assert python_episode.metrics.failed_calls == 1


async def test_python_timeout_is_reported_and_the_session_restarts(
    python_episode: Episode,
) -> None:
    await python_episode.astep(py("y = 1"))
    (message,) = await python_episode.astep(py("while True:\n    pass"))
    assert message["content"].startswith("Error: TimeoutError: ")
    assert "time limit" in message["content"] and "restarted" in message["content"]
    assert python_episode.metrics.timeouts == 1
    (message,) = await python_episode.astep(py("print('y' in globals())"))
    assert message["content"].startswith("False")


async def test_fork_copies_python_state_then_diverges(executor: PythonExecutorService) -> None:
    async with Episode([python_tool(executor)], python=executor, prompt="go") as parent:
        parent.state["picked"] = ["base"]
        await parent.astep(py("x = 1\nopen('f.txt', 'w').write('base')"))
        left, right = await parent.afork(2)
        try:
            assert len({parent.id, left.id, right.id}) == 3
            assert len({parent.python_session, left.python_session, right.python_session}) == 3
            assert left.messages == parent.messages and left.turns == parent.turns == 1
            assert left.metrics == parent.metrics and left.metrics is not parent.metrics
            left.state["picked"].append("left")
            assert parent.state["picked"] == ["base"] == right.state["picked"]

            await left.astep(py("x = 2\nopen('f.txt', 'w').write('left')"))
            show = py("print(x, open('f.txt').read())")
            assert (await right.astep(show))[0]["content"] == "1 base\n"
            assert (await parent.astep(show))[0]["content"] == "1 base\n"
            assert (await left.astep(show))[0]["content"] == "2 left\n"
            assert len(left.messages) == 7 and len(parent.messages) == 5
            assert left.messages[:3] == parent.messages[:3] != right.messages[:4]
        finally:
            await left.aclose()
            await right.aclose()


async def test_fork_without_python_and_of_a_fresh_session(executor: PythonExecutorService) -> None:
    plain = Episode([add], prompt="hi")
    (copy,) = await plain.afork(1)
    assert copy.python_session is None and copy.messages == plain.messages
    with pytest.raises(UserError, match="n >= 1"):
        await plain.afork(0)
    async with Episode([python_tool(executor)]) as fresh:  # no call yet: forks an empty session
        (twin,) = await fresh.afork(1)
        async with twin:
            assert (await twin.astep(py("print(1)")))[0]["content"] == "1\n"


async def test_close_releases_the_session(executor: PythonExecutorService) -> None:
    episode = Episode([python_tool(executor)], python=executor)
    await episode.astep(py("z = 3"))
    (copy,) = await episode.afork(1)
    before = executor.stats()["sessions"]
    await episode.aclose()
    await episode.aclose()  # idempotent
    assert executor.stats()["sessions"] == before - 1
    assert episode.done and episode.reason == "closed"
    with pytest.raises(UserError, match="done"):
        await episode.astep(py("print(z)"))
    with pytest.raises(UserError, match="closed"):
        await episode.afork(1)
    # the copy is independent of its closed parent
    assert (await copy.astep(py("print(z)")))[0]["content"] == "3\n"
    await copy.aclose()
    assert executor.stats()["sessions"] == before - 2


async def test_configuration_errors(executor: PythonExecutorService) -> None:
    with pytest.raises(UserError, match="max_turns"):
        Episode([add], max_turns=0)
    with pytest.raises(UserError, match="result_format"):
        Episode([add], result_format="xml")  # type: ignore[arg-type]
    with pytest.raises(UserError, match="parser"):
        Episode([add], parser=42)  # type: ignore[arg-type]
    other = PythonExecutorService(pool_size=1)
    try:
        with pytest.raises(UserError, match="another executor"):
            Episode([python_tool(executor)], python=other)
    finally:
        other.close()
    episode = Episode([add])
    with pytest.raises(UserError, match="assistant message"):
        await episode.astep(None)  # type: ignore[arg-type]


async def test_python_tool_outside_an_episode_runs_fresh(executor: PythonExecutorService) -> None:
    dispatcher = Dispatcher(ToolRegistry([python_tool(executor)]))
    parse = Episode(dispatcher.registry).parser(py("print(6 * 7)"))
    (outcome,) = await dispatcher.arun([parse])
    assert outcome.results[0].ok and outcome.results[0].value == "42\n"


async def test_a_cancelled_step_leaves_the_episode_as_it_was() -> None:
    started = anyio.Event()

    @tool
    async def slow() -> str:
        """Waits until cancelled."""
        started.set()
        await anyio.sleep_forever()
        return "never"

    episode = Episode([slow, add], prompt="go", timeout=60)
    async with anyio.create_task_group() as tg:
        tg.start_soon(episode.astep, hermes("slow", {}))
        await started.wait()
        tg.cancel_scope.cancel()
    assert episode.turns == 0 and len(episode.messages) == 1 and not episode.done
    (message,) = await episode.astep(hermes("add", {"a": 1, "b": 1}))
    assert message["content"] == "2" and episode.turns == 1


async def test_a_done_episode_forks_into_done_copies() -> None:
    episode = Episode([add])
    await episode.astep("no calls")
    (copy,) = await episode.afork(1)
    assert copy.done and copy.reason == "answered"
    with pytest.raises(UserError, match="done"):
        await copy.astep("again")


async def test_episodes_given_the_same_id_still_get_their_own_sessions(
    executor: PythonExecutorService,
) -> None:
    run = python_tool(executor)
    async with Episode([run], episode_id="task-1") as a, Episode([run], episode_id="task-1") as b:
        await a.astep(py("secret = 1"))
        (message,) = await b.astep(py("print('secret' in globals())"))
        assert message["content"] == "False\n"


async def test_a_dropped_episode_still_ends_its_session(executor: PythonExecutorService) -> None:
    import gc

    episode = Episode([python_tool(executor)])
    await episode.astep(py("kept = 1"))
    before = executor.stats()["sessions"]
    del episode
    gc.collect()
    # a call on the executor's loop runs after the close the finalizer scheduled there
    await executor.aclose_session("no-such-session")
    assert executor.stats()["sessions"] == before - 1
