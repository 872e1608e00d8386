"""Every piece of shared state has an owner with a lifecycle (issue 16): the order of a
trainer's calls on an episode, the episodes' settings (one EpisodeSpec), verl's shared
executors and PersistentPythonProcess's shared executor."""

from __future__ import annotations

import functools
from typing import Any

import anyio
import pytest

from toolservices import (
    Episode,
    PersistentPythonProcess,
    PythonExecutorService,
    ToolEnv,
    ToolRegistry,
    UserError,
    tool,
)
from toolservices.env import EpisodeSpec, check_episode_options, python_tool
from toolservices.rollout import Rollout
from toolservices.trainers import _calls
from toolservices.trainers._calls import adapter_spec, run_call
from toolservices.trainers._executors import SharedExecutors

order: list[str] = []


@tool
async def step(label: str, gate: Any = None) -> str:
    """Records its label, after waiting for the gate when given one."""
    if gate is not None:
        await gate.wait()
    order.append(label)
    return label


@tool
def echo(value: Any) -> str:
    """Shows the value's type: what the trainer handed over, untouched."""
    return type(value).__name__


async def test_calls_handed_over_concurrently_run_one_at_a_time_in_order() -> None:
    order.clear()
    spec = adapter_spec([step])
    episode = spec.new_episode()
    gate = anyio.Event()
    replies: dict[str, str] = {}

    async def call(label: str, **extra: Any) -> None:
        replies[label] = await run_call(episode, "step", {"label": label, **extra})

    async with anyio.create_task_group() as tg:
        tg.start_soon(functools.partial(call, "a", gate=gate))
        await anyio.wait_all_tasks_blocked()  # "a" holds the episode
        tg.start_soon(call, "b")
        await anyio.wait_all_tasks_blocked()
        tg.start_soon(call, "c")
        await anyio.wait_all_tasks_blocked()
        assert order == [] and episode.turns == 0
        gate.set()
    assert order == ["a", "b", "c"] and replies == {"a": "a", "b": "b", "c": "c"}
    assert episode.turns == 3 and not episode.done  # a trainer's episode never "answers"
    assert not hasattr(_calls, "_LOCKS")  # the episode orders its calls itself


async def test_a_parsed_call_reaches_the_tool_without_a_json_round_trip() -> None:
    episode = adapter_spec([echo]).new_episode()
    # JSON text would have turned the set into a string ("{1, 2}")
    assert await run_call(episode, "echo", {"value": {1, 2}}, call_id="call_7") == "set"
    assistant, reply = episode.messages
    assert assistant["tool_calls"][0]["id"] == "call_7" == reply["tool_call_id"]
    assert "unknown" in (await run_call(episode, "nope", {})).lower()


async def test_an_ended_episode_says_so() -> None:
    episode = adapter_spec([step], max_turns=1).new_episode()
    assert await run_call(episode, "step", {"label": "x"}) == "x"
    text = await run_call(episode, "step", {"label": "y"})
    assert text.startswith("Error: the episode has ended (max_turns)")


def test_settings_are_checked_by_a_plain_function(tmp_path: Any) -> None:
    with pytest.raises(UserError, match="max_turns"):
        check_episode_options(ToolRegistry([step]), max_turns=0)
    with pytest.raises(UserError, match="result_format"):
        check_episode_options(ToolRegistry([step]), result_format="xml")
    with pytest.raises(UserError, match="at least one tool"):
        adapter_spec([])
    one = PythonExecutorService.__new__(PythonExecutorService)  # never started: only compared
    two = PythonExecutorService.__new__(PythonExecutorService)
    one.timeout = two.timeout = 1.0
    registry = ToolRegistry([python_tool(one)])
    assert check_episode_options(registry) is one
    with pytest.raises(UserError, match="another executor than python="):
        check_episode_options(registry, python=two)


def test_toolenv_rollout_and_adapters_make_episodes_from_one_spec() -> None:
    env = ToolEnv([step], max_turns=3)
    rollout = Rollout([step], model="m", base_url="http://127.0.0.1:9", max_turns=2)
    adapter = adapter_spec([step])
    for spec in (env.spec, rollout.spec, adapter):
        assert isinstance(spec, EpisodeSpec)
        episode = spec.new_episode()
        assert isinstance(episode, Episode)
        assert episode._dispatcher.shares_bound_with(spec.dispatcher)
    assert rollout.new_episode("hi").max_turns == 2 and env.spec.max_turns == 3


def test_shared_executors_have_an_owner_that_closes_them() -> None:
    owner = SharedExecutors()
    first = owner.get(pool_size=1, timeout=2.0)
    assert owner.get(timeout=2.0, pool_size=1) is first and len(owner) == 1
    assert owner.get(pool_size=1, timeout=3.0) is not first and len(owner) == 2
    assert first.execute("print(1)").stdout == "1\n"
    owner.close()
    assert len(owner) == 0
    assert first._closed
    fresh = owner.get(pool_size=1, timeout=2.0)
    try:
        assert fresh is not first and fresh.execute("print(2)").stdout == "2\n"
    finally:
        owner.close()


def test_persistent_processes_share_an_executor_their_class_can_close() -> None:
    PersistentPythonProcess.shutdown_shared()  # a no-op, or ends a previous test's
    a, b = PersistentPythonProcess(timeout=2.0), PersistentPythonProcess(timeout=2.0)
    assert a._service is b._service
    assert a.execute("x = 1").success and b.execute("print('x' in globals())").stdout == "False\n"
    PersistentPythonProcess.shutdown_shared()
    assert a._service._closed
    c = PersistentPythonProcess(timeout=2.0)
    try:
        assert c._service is not a._service and c.execute("print(3)").stdout == "3\n"
    finally:
        PersistentPythonProcess.shutdown_shared()
