"""Episode follows the API's rule: ``step`` is synchronous, ``astep`` the coroutine (issue 16).

``Episode.step`` used to be the coroutine, unlike ``ToolEnv.step`` and
``Dispatcher.run``; calling it from sync code returned an un-awaited coroutine.
"""

from __future__ import annotations

import inspect

import pytest

from toolservices import Episode, PythonExecutorService, python_tool, tool


@tool
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


def hermes(a: int, b: int) -> str:
    return f'<tool_call>{{"name": "add", "arguments": {{"a": {a}, "b": {b}}}}}</tool_call>'


def test_the_sync_and_async_names() -> None:
    for sync, coroutine in (
        ("step", "astep"),
        ("run_turn", "arun_turn"),
        ("fork", "afork"),
        ("close", "aclose"),
    ):
        assert not inspect.iscoroutinefunction(getattr(Episode, sync)), sync
        assert inspect.iscoroutinefunction(getattr(Episode, coroutine)), coroutine
    assert inspect.iscoroutinefunction(Episode.astep_calls)


def test_sync_code_steps_an_episode() -> None:
    episode = Episode([add])
    (message,) = episode.step(hermes(1, 2))
    assert message["content"] == "3" and episode.turns == 1
    outcome = episode.run_turn(hermes(2, 2))
    assert outcome.results[0].value == 4 and len(episode.messages) == 2  # run_turn renders nothing
    (copy,) = episode.fork(1)
    assert copy.step("done") == [] and copy.done and not episode.done
    episode.close()
    assert episode.closed and episode.reason == "closed"


async def test_async_code_awaits_astep() -> None:
    episode = Episode([add])
    (message,) = await episode.astep(hermes(3, 4))
    assert message["content"] == "7"
    (twin,) = await episode.afork(1)
    await twin.aclose()
    assert twin.closed and not episode.closed


def test_sync_close_ends_the_python_session() -> None:
    with PythonExecutorService(pool_size=1, timeout=3.0) as executor:
        episode = Episode([python_tool(executor)])
        call = '<tool_call>{"name": "python", "arguments": {"code": "x = 1"}}</tool_call>'
        episode.step(call)
        assert executor.stats()["sessions"] == 1
        episode.close()
        assert executor.stats()["sessions"] == 0


def test_step_on_the_library_loop_says_to_use_astep() -> None:
    from toolservices import _portal

    episode = Episode([add])

    async def inside() -> None:
        episode.step(hermes(1, 1))

    with pytest.raises(RuntimeError, match="use the async variant"):
        _portal.run_sync(inside)
