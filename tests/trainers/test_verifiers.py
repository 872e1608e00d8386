"""verifiers adapter: its own rollout loop against a loopback OpenAI-compatible server.

verifiers (0.2/0.3) pins mcp<2 and openai<3... and so conflicts with the main
venv's mcp extra: .ci/run runs this file in .venv-verifiers.
"""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
import warnings
from pathlib import Path

import anyio
import pytest

pytest.importorskip("verifiers")

with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)
    import verifiers as vf
    from datasets import Dataset
    from openai import AsyncOpenAI
    from verifiers.clients import OpenAIChatCompletionsClient

    from toolservices import PythonExecutorService, tool
    from toolservices.env import python_tool
    from toolservices.trainers.verifiers import EPISODE_KEY, ToolservicesEnv

sys.path.insert(0, str(Path(__file__).parent))
import _chat_server  # noqa: E402
from _hang_tool import hang  # noqa: E402

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


@pytest.mark.anyio
async def test_a_hanging_tool_times_out(llm):
    dataset = Dataset.from_list([{"question": "hang"}])
    env = ToolservicesEnv([hang], timeout=0.5, dataset=dataset, max_turns=3)
    state = await env.rollout(rollout_input("hang"), llm, "scripted")
    (text,) = tool_texts(state)
    assert "timed out" in text.lower()
    assert state["completion"][-1].content == "done"  # the rollout went on after it


REPO = Path(__file__).resolve().parents[2]
#: ``toolservices serve --mcp`` needs the MCP SDK 2, verifiers <0.4 pins 1.x: the server
#: runs from the main venv (CI builds it first), as it would in production: its own process.
SERVER_BIN = Path(os.environ.get("TOOLSERVICES_MCP_BIN", REPO / ".venv" / "bin" / "toolservices"))


@pytest.fixture(scope="module")
def mcp_server_url():
    assert SERVER_BIN.exists(), (
        f"{SERVER_BIN} not found: build the main venv first (.ci/run does), "
        "or point TOOLSERVICES_MCP_BIN at a toolservices with the mcp extra"
    )
    proc = subprocess.Popen(
        [str(SERVER_BIN), "serve", "--mcp", "--transport", "http", "--host", "127.0.0.1"]
        + ["--port", "0", "--timeout", "5"],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    lines: queue.Queue[str] = queue.Queue()

    def pump() -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            lines.put(line)
        lines.put("")

    pumping = threading.Thread(target=pump, daemon=True)
    pumping.start()
    url = None
    seen = []
    while url is None:
        line = lines.get(timeout=120)
        seen.append(line)
        if not line:
            raise AssertionError(f"MCP server exited: {''.join(seen)}")
        if "ready:" in line:
            url = line.split("ready:", 1)[1].strip()
    try:
        yield url
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(30)
        pumping.join(30)
        assert proc.stderr is not None
        proc.stderr.close()


@pytest.mark.anyio
async def test_our_mcp_server_as_a_verifiers_toolset_by_url(mcp_server_url, server_url):
    """The docs' recipe: a v1 Toolset pointing at ``toolservices serve --mcp`` by URL.

    verifiers' own ``serve_shared`` resolves the toolset to the URL (nothing is
    launched), and its own harness program (the null/chat harness) lists and
    calls our server's tools with its MCP client while talking to the
    loopback model server.
    """
    import verifiers.v1 as v1
    from verifiers.v1.mcp import serve_shared

    class ToolservicesPython(v1.Toolset[v1.SharedToolsetConfig]):
        TOOL_PREFIX = None  # keep the server's tool names (python_execute, ...)

    toolset = ToolservicesPython(v1.SharedToolsetConfig(url=mcp_server_url))
    async with serve_shared([toolset]) as servers:
        mcp_config = {
            "mcpServers": {name: {"url": s.url, "timeout": 60} for name, s in servers.items()}
        }
    assert mcp_config["mcpServers"] == {"": {"url": mcp_server_url, "timeout": 60}}
    program = Path(v1.__file__).parent / "harnesses" / "null" / "program.py"
    result = await anyio.run_process(
        [sys.executable, str(program), "--base-url", server_url, "--api-key", "loopback"]
        + ["--model", "scripted", "--prompt", "mcp", "--mcp-config", json.dumps(mcp_config)],
        check=False,
    )
    assert result.returncode == 0, result.stderr.decode()
    tools = [m["content"] for m in _chat_server.LAST_MESSAGES["mcp"] if m["role"] == "tool"]
    results = [json.loads(text) for text in tools]
    assert results[0]["stdout"] == "42\n"
    assert results[1]["success"] is True
    # Known limit (docs/trainers.md): our server scopes a session_id to the MCP connection,
    # and verifiers' harness programs open a new connection for every call, so state set in
    # one call is gone in the next.
    assert results[2]["exception"]["type"] == "NameError"


@pytest.mark.anyio
async def test_evaluate_scores_rollouts_with_a_rubric(executor, llm):
    """The docs' recipe end to end: verifiers' evaluate(), our env, a reward function."""

    def correct(completion, answer) -> float:
        tool_text = [m.content for m in completion if m.role == "tool"]
        return 1.0 if tool_text and str(tool_text[-1]).strip() == answer else 0.0

    env = ToolservicesEnv(
        [python_tool(executor), lookup],
        timeout=10.0,
        dataset=Dataset.from_list([{"question": "count", "answer": "2"}] * 2),
        rubric=vf.Rubric(funcs=[correct]),
        max_turns=8,
    )
    results = await env.evaluate(llm, "scripted", num_examples=2, rollouts_per_example=2)
    assert [o["reward"] for o in results["outputs"]] == [1.0] * 4
