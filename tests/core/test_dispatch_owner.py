"""The dispatcher owns its bound and its abandoned-thread counts (issue 16).

``max_concurrency`` bounded each ``arun`` call on its own: three concurrent
calls with a bound of 2 ran 6 tool calls at once, and the bound episodes
shared lived in a module table of ``env/episode.py``.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable

import anyio
import anyio.lowlevel
import pytest

from toolservices import Dispatcher, Episode, ToolCall, ToolEnv, ToolRegistry, UserError, tool
from toolservices.tools import Tool


class AsyncGate:
    """An async tool that counts the calls inside it and holds them until opened."""

    def __init__(self) -> None:
        self.inside = 0
        self.peak = 0
        self.open = anyio.Event()

    def tool(self, name: str = "slow") -> Tool:
        async def slow() -> str:
            """Waits for the gate."""
            self.inside += 1
            self.peak = max(self.peak, self.inside)
            await self.open.wait()
            self.inside -= 1
            return "ok"

        return tool(name=name)(slow)


class ThreadGate:
    """A sync tool that counts the threads inside it and holds them until released."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.lock = threading.Lock()
        self.inside = 0
        self.peak = 0

    def tool(self, name: str = "hold", timeout: float | None = None) -> Tool:
        def hold() -> str:
            """Blocks until the test releases it."""
            with self.lock:
                self.inside += 1
                self.peak = max(self.peak, self.inside)
            try:
                self.release.wait(60)
            finally:
                with self.lock:
                    self.inside -= 1
            return "ok"

        return tool(name=name, timeout=timeout)(hold)


def wait_until(condition: Callable[[], bool], what: str) -> None:
    """Bounded wait for a condition other threads make true."""
    deadline = time.monotonic() + 30
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.001)


async def test_concurrent_arun_calls_share_the_bound() -> None:
    """The reproduction of issue 16: 3 x arun(2 items), max_concurrency=2 ran 6 calls."""
    gate = AsyncGate()
    dispatcher = Dispatcher(ToolRegistry([gate.tool()]), max_concurrency=2)
    batch = [[ToolCall("slow", {})], [ToolCall("slow", {})]]
    outcomes: list[object] = []

    async def run() -> None:
        outcomes.extend(await dispatcher.arun(batch))

    async with anyio.create_task_group() as tg:
        for _ in range(3):
            tg.start_soon(run)
        await anyio.wait_all_tasks_blocked()  # each call is in the tool or waits for the bound
        assert gate.inside == 2
        assert dispatcher._limits.bound.waiting == 4
        gate.open.set()
    assert gate.peak == 2 and len(outcomes) == 6


async def test_single_calls_and_items_take_the_bound_too() -> None:
    gate = AsyncGate()
    dispatcher = Dispatcher(ToolRegistry([gate.tool()]), max_concurrency=1)
    async with anyio.create_task_group() as tg:
        tg.start_soon(dispatcher.acall, ToolCall("slow", {}))
        tg.start_soon(dispatcher.arun_item, [ToolCall("slow", {})])
        tg.start_soon(dispatcher.arun, [[ToolCall("slow", {})]])
        await anyio.wait_all_tasks_blocked()
        assert gate.inside == 1
        gate.open.set()
    assert gate.peak == 1


async def test_a_derived_dispatcher_shares_the_parents_bound() -> None:
    gate = AsyncGate()
    other = AsyncGate()
    parent = Dispatcher(ToolRegistry([gate.tool()]), max_concurrency=2, timeout=5)
    child = parent.with_options(registry=ToolRegistry([other.tool()]), timeout=None)
    assert child.shares_bound_with(parent) and child.timeout is None and parent.timeout == 5
    assert child.max_concurrency == 2 and child.registry is not parent.registry
    async with anyio.create_task_group() as tg:
        for _ in range(2):
            tg.start_soon(parent.arun, [[ToolCall("slow", {})]])
            tg.start_soon(child.arun, [[ToolCall("slow", {})]])
        await anyio.wait_all_tasks_blocked()
        assert gate.inside + other.inside == 2
        gate.open.set()
        other.open.set()
    assert not Dispatcher(parent.registry).shares_bound_with(parent)


def test_with_options_checks_the_timeout() -> None:
    with pytest.raises(UserError, match="timeout"):
        Dispatcher(ToolRegistry()).with_options(timeout=0)


def test_the_bound_holds_across_event_loops_and_sync_callers() -> None:
    """run() (the shared loop) and asyncio.run() in other threads: one bound of 2."""
    gate = ThreadGate()
    dispatcher = Dispatcher(ToolRegistry([gate.tool()]), max_concurrency=2)
    batch = [[ToolCall("hold", {})], [ToolCall("hold", {})]]
    errors: list[BaseException] = []

    def guarded(fn: Callable[[], object]) -> Callable[[], None]:
        def run() -> None:
            try:
                fn()
            except BaseException as exc:  # reported by the test thread
                errors.append(exc)

        return run

    threads = [
        threading.Thread(target=guarded(lambda: dispatcher.run(batch))),
        threading.Thread(target=guarded(lambda: asyncio.run(dispatcher.arun(batch)))),
        threading.Thread(target=guarded(lambda: asyncio.run(dispatcher.arun(batch)))),
    ]
    for thread in threads:
        thread.start()
    try:
        bound = dispatcher._limits.bound
        wait_until(lambda: bound.held == 2 and bound.waiting == 4, "2 calls in, 4 waiting")
        with gate.lock:
            assert gate.inside <= 2
    finally:
        gate.release.set()
        for thread in threads:
            thread.join(60)
    assert not errors and gate.peak <= 2 and dispatcher._limits.bound.held == 0


async def test_a_cancelled_waiter_does_not_lose_a_token() -> None:
    gate = AsyncGate()
    dispatcher = Dispatcher(ToolRegistry([gate.tool()]), max_concurrency=1, timeout=None)
    async with anyio.create_task_group() as tg:
        tg.start_soon(dispatcher.acall, ToolCall("slow", {}))
        await anyio.wait_all_tasks_blocked()
        with anyio.move_on_after(0.01):  # waits for the bound, then gives up
            await dispatcher.acall(ToolCall("slow", {}))
        assert dispatcher._limits.bound.waiting == 0
        gate.open.set()
    assert dispatcher._limits.bound.held == 0
    result = await dispatcher.acall(ToolCall("slow", {}))
    assert result.ok


def test_abandoned_threads_are_counted_by_their_dispatcher() -> None:
    """Each dispatcher (with the ones derived from it) owns its tools' counts."""
    gate = ThreadGate()
    hang = gate.tool(timeout=0.05)
    registry = ToolRegistry([hang])
    first = Dispatcher(registry, max_abandoned_threads=1)
    derived = first.with_options(stop_on_error=True)
    other = Dispatcher(registry, max_abandoned_threads=1)
    try:
        (timed_out,) = first.run([[ToolCall("hold", {})]])
        assert timed_out.results[0].error_kind == "timeout"
        wait_until(lambda: first.abandoned_calls() == {"hold": 1}, "the abandoned call counted")
        assert derived.abandoned_calls() == {"hold": 1} and other.abandoned_calls() == {}
        (refused,) = derived.run([[ToolCall("hold", {})]])
        assert refused.results[0].error_kind == "infrastructure"
        (independent,) = other.run([[ToolCall("hold", {})]])
        assert independent.results[0].error_kind == "timeout"
    finally:
        gate.release.set()
    assert first.wait_abandoned(timeout=60) and other.wait_abandoned(timeout=60)
    assert first.abandoned_calls() == {}


async def test_episodes_share_their_dispatchers_bound_without_a_module_table() -> None:
    import toolservices.env.episode as episode_module

    assert not hasattr(episode_module, "_LIMITERS")
    gate = AsyncGate()
    slow = gate.tool()
    shared = Dispatcher(ToolRegistry([slow]), max_concurrency=2)
    # an episode with its own timeout runs on a dispatcher derived from the shared one
    episodes = [Episode([slow], dispatcher=shared, timeout=30) for _ in range(4)]
    assert all(e._dispatcher.shares_bound_with(shared) for e in episodes)
    call = '<tool_call>\n{"name": "slow", "arguments": {}}\n</tool_call>'
    async with anyio.create_task_group() as tg:
        for episode in episodes:
            tg.start_soon(episode.astep, call)
        tg.start_soon(shared.arun, [[ToolCall("slow", {})]])
        await anyio.wait_all_tasks_blocked()
        assert gate.inside == 2
        gate.open.set()
    assert gate.peak == 2


def test_toolenv_step_and_astep_mix_on_one_env() -> None:
    """step() runs on the shared loop, astep() on the caller's: one bound serves both."""

    @tool
    async def ping() -> str:
        """Answers at once."""
        await anyio.lowlevel.checkpoint()
        return "pong"

    env = ToolEnv([ping], max_concurrency=1, max_turns=4)
    env.reset(["a", "b", "c"])
    call = '<tool_call>\n{"name": "ping", "arguments": {}}\n</tool_call>'
    first = env.step([call] * 3)
    second = asyncio.run(env.astep([call] * 3))
    third = env.step([call] * 3)
    for step in (first, second, third):
        assert [r.results[0].ok for r in step.results] == [True] * 3
    assert env.dispatcher._limits.bound.held == 0


def test_a_copied_dispatcher_owns_a_fresh_bound_of_the_same_size() -> None:
    """Locks cannot be copied; a deep copy or a pickled dispatcher gets its own bound."""
    import copy
    import pickle

    dispatcher = Dispatcher(ToolRegistry([echo_tool]), max_concurrency=3, max_abandoned_threads=2)
    twin = copy.deepcopy(dispatcher)
    assert twin.max_concurrency == 3 and twin.max_abandoned_threads == 2
    assert not twin.shares_bound_with(dispatcher)
    (outcome,) = twin.run([[ToolCall("echo_tool", {"x": 1})]])
    assert outcome.results[0].value == 1
    shipped = pickle.loads(pickle.dumps(Dispatcher(ToolRegistry(), max_concurrency=5)))
    assert shipped.max_concurrency == 5 and shipped.run([[]])[0].results == []
    episode = Episode([echo_tool], dispatcher=dispatcher)
    assert copy.deepcopy(episode)._turns is not episode._turns


@tool
def echo_tool(x: int) -> int:
    """Returns its argument."""
    return x
