"""verifiers adapter: its own rollout loop against a loopback OpenAI-compatible server.

verifiers (0.2/0.3) pins mcp<2 and openai<3... and so conflicts with the main
venv's mcp extra: .ci/run runs this file in .venv-verifiers.
"""

from __future__ import annotations

import sys
import warnings
from pathlib import Path

import pytest

pytest.importorskip("verifiers")

with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)
    from datasets import Dataset
    from openai import AsyncOpenAI
    from verifiers.clients import OpenAIChatCompletionsClient

    from toolservices import PythonExecutorService, tool
    from toolservices.env import python_tool
    from toolservices.trainers.verifiers import EPISODE_KEY, ToolservicesEnv

sys.path.insert(0, str(Path(__file__).parent))
import _chat_server  # noqa: E402

sys.path.pop(0)


@tool
def lookup(query: str) -> str:
    """Look a word up.

    Args:
        query: The word.
    """
    return query.upper()


@pytest.fixture
def executor():
    with PythonExecutorService(pool_size=2, timeout=2.0) as ex:
        yield ex
        assert ex.stats()["sessions"] == 0, "a rollout leaked a Python session"


@pytest.fixture(scope="module")
def server_url():
    with _chat_server.serve() as url:
        yield url


def make_env(executor, **kwargs) -> ToolservicesEnv:
    dataset = Dataset.from_list([{"question": "count", "answer": "2"}])
    return ToolservicesEnv([python_tool(executor), lookup], dataset=dataset, max_turns=5, **kwargs)


@pytest.fixture
async def llm(server_url):
    openai_client = AsyncOpenAI(base_url=server_url, api_key="loopback")
    yield OpenAIChatCompletionsClient(openai_client)
    await openai_client.close()


def rollout_input(prompt: str, example_id: int = 0) -> dict:
    return {
        "prompt": [{"role": "user", "content": prompt}],
        "answer": "",
        "example_id": example_id,
    }


def tool_texts(state) -> list[str]:
    return [str(m.content).strip() for m in state["completion"] if m.role == "tool"]


def test_tool_defs_come_from_the_toolservices_tools(executor):
    env = make_env(executor)
    names = [t.name for t in env.tool_defs]
    assert names == ["python", "lookup"]
    lookup_def = env.tool_defs[1]
    assert lookup_def.parameters["required"] == ["query"]
    assert EPISODE_KEY not in str(lookup_def.parameters)


@pytest.mark.anyio
async def test_rollouts_keep_state_within_and_never_across(executor, llm):
    env = make_env(executor)
    first = await env.rollout(rollout_input("count"), llm, "scripted")
    assert first["error"] is None
    assert tool_texts(first) == ["1", "2"]  # one session through the rollout
    assert EPISODE_KEY not in first  # the cleanup handler took it out and closed it
    assert executor.stats()["sessions"] == 0
    second = await env.rollout(rollout_input("count", 1), llm, "scripted")
    assert tool_texts(second) == ["1", "2"]  # a fresh session


@pytest.mark.anyio
async def test_concurrent_rollouts_are_isolated(executor, llm):
    import anyio

    env = make_env(executor)
    states = []

    async def one(k: int) -> None:
        states.append(await env.rollout(rollout_input("count", k), llm, "scripted"))

    async with anyio.create_task_group() as tg:
        for k in range(3):
            tg.start_soon(one, k)
    assert [tool_texts(s) for s in states] == [["1", "2"]] * 3


@pytest.mark.anyio
async def test_runaway_code_and_unknown_tools_become_messages(executor, llm):
    env = make_env(executor)
    spun = await env.rollout(rollout_input("spin"), llm, "scripted")
    (text,) = tool_texts(spun)
    assert "time limit" in text
    unknown = await env.rollout(rollout_input("unknown"), llm, "scripted")
    (text,) = tool_texts(unknown)
    assert "nope" in text and "Error" in text


@tool
async def hang(seconds: float) -> str:
    """Never returns before the call's time limit.

    Args:
        seconds: Ignored.
    """
    import anyio

    await anyio.Event().wait()
    return "unreachable"


@pytest.mark.anyio
async def test_a_hanging_tool_times_out(llm):
    dataset = Dataset.from_list([{"question": "hang"}])
    env = ToolservicesEnv([hang], timeout=0.5, dataset=dataset, max_turns=3)
    state = await env.rollout(rollout_input("hang"), llm, "scripted")
    (text,) = tool_texts(state)
    assert "timed out" in text.lower()
    assert state["completion"][-1].content == "done"  # the rollout went on after it
