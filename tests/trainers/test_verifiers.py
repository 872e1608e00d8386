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

# Run in a venv of their own (.ci/run), where their durations were not measured
# against the suite's 60 s: they keep the bound they had.
pytestmark = pytest.mark.timeout(300)

import httpx  # noqa: E402  (verifiers brings it; the main venv has httpx2 only)

with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)
    import verifiers as vf
    from datasets import Dataset
    from openai import AsyncOpenAI
    from verifiers.clients import OpenAIChatCompletionsClient

    from toolservices import tool
    from toolservices.env import python_tool
    from toolservices.trainers.verifiers import EPISODE_KEY, ToolservicesEnv, mcp_rollout_url

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
#: The token the test's server accepts (given to it in its environment, as an operator would).
MCP_TOKEN = "vf-test-token-0123456789abcdef"


@pytest.fixture(scope="module")
def mcp_server_url():
    assert SERVER_BIN.exists(), (
        f"{SERVER_BIN} not found: build the main venv first (.ci/run does), "
        "or point TOOLSERVICES_MCP_BIN at a toolservices with the mcp extra"
    )
    proc = subprocess.Popen(
        [str(SERVER_BIN), "serve", "--mcp", "--transport", "http", "--host", "127.0.0.1"]
        + ["--port", "0", "--timeout", "5", "--session-scope", "namespace"],
        env={**os.environ, "TOOLSERVICES_MCP_TOKENS": MCP_TOKEN},
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


async def _harness_run(mcp_urls: dict[str, str], server_url: str, prompt: str) -> list[dict]:
    """verifiers' own null-harness program, given the tool servers as NullHarness.launch does
    (an ``mcpServers`` URL config); the tool results it sent back to the model."""
    import verifiers.v1 as v1

    mcp_config = {
        "mcpServers": {name: {"url": url, "timeout": 60} for name, url in mcp_urls.items()}
    }
    program = Path(v1.__file__).parent / "harnesses" / "null" / "program.py"
    result = await anyio.run_process(
        [sys.executable, str(program), "--base-url", server_url, "--api-key", "loopback"]
        + ["--model", "scripted", "--prompt", prompt, "--mcp-config", json.dumps(mcp_config)],
        check=False,
    )
    assert result.returncode == 0, result.stderr.decode()
    tools = [m["content"] for m in _chat_server.LAST_MESSAGES[prompt] if m["role"] == "tool"]
    return [json.loads(text) for text in tools]


@pytest.mark.anyio
async def test_our_mcp_server_as_a_verifiers_toolset_by_url(mcp_server_url, server_url):
    """The docs' recipe: a task-scoped v1 Toolset whose URL carries the token and a fresh
    namespace per rollout (``mcp_rollout_url``), on ``serve --mcp --session-scope namespace``.

    verifiers' own ``serve_tools`` resolves each rollout's toolsets to URLs
    (nothing is launched), and its own harness program lists and calls our
    server's tools, on a new MCP connection per call, while talking to the
    loopback model server. Python state lasts through a rollout and stays in it.
    """
    import verifiers.v1 as v1
    from verifiers.v1.mcp import serve_tools
    from verifiers.v1.runtimes import SubprocessConfig, SubprocessRuntime

    class ToolservicesPython(v1.Toolset[v1.ToolsetConfig]):
        TOOL_PREFIX = None  # keep the server's tool names (python_execute, ...)

    class PythonTask(v1.Task):
        @classmethod
        def toolsets(cls, config: v1.TaskConfig) -> list[v1.Toolset]:
            url = mcp_rollout_url(mcp_server_url, token=MCP_TOKEN)
            return [ToolservicesPython(v1.ToolsetConfig(url=url))]

    async def rollout_urls() -> dict[str, str]:  # what a rollout hands its harness
        toolsets = PythonTask.toolsets(v1.TaskConfig())
        async with serve_tools(toolsets, SubprocessRuntime(SubprocessConfig())) as urls:
            return dict(urls)

    first = await rollout_urls()
    assert first[""].startswith(mcp_server_url + "?access_token=")
    results = await _harness_run(first, server_url, "mcp")
    assert results[0]["stdout"] == "42\n"
    assert results[1]["success"] is True
    # Three calls, three MCP connections, one Python session: the rollout's namespace.
    assert results[2]["stdout"] == "21\n"
    (peek,) = await _harness_run(await rollout_urls(), server_url, "mcp-peek")
    assert peek["exception"]["type"] == "NameError"  # another rollout: another namespace
    (again,) = await _harness_run(first, server_url, "mcp-peek")
    assert again["stdout"] == "20\n"  # the first rollout's URL still reaches its state
    # Without the token the server refuses: the harness cannot even list the tools.
    async with httpx.AsyncClient() as client:
        assert (await client.post(mcp_server_url, json={})).status_code == 401


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


def test_mcp_rollout_url_adds_the_token_and_a_fresh_namespace():
    base = "http://127.0.0.1:8765/mcp?keep=1&namespace=old"
    one, two = mcp_rollout_url(base, token="t" * 20), mcp_rollout_url(base, token="t" * 20)
    assert one != two  # a fresh namespace each call: one per rollout
    assert one.startswith("http://127.0.0.1:8765/mcp?keep=1&access_token=tttt")
    assert "namespace=old" not in one and "namespace=vf-" in one
    assert mcp_rollout_url(base, token="t" * 20, namespace="r-7").endswith("&namespace=r-7")
