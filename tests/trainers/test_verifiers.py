"""verifiers 0.4 adapter: verifiers' own rollout code against a loopback model server.

Each test runs ``Agent.run`` (verifiers' rollout: interception server,
tool servers started per rollout in the subprocess runtime, its bundled
chat program as the harness) with :class:`ToolservicesToolset` as the
task's toolset, against ``ScriptedChatServer``. verifiers pins mcp 2 and
openai 2, unlike the main venv: .ci/run runs this file in .venv-verifiers.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import uuid
from pathlib import Path
from typing import Any

import anyio
import psutil
import pytest

vf = pytest.importorskip("verifiers.v1")

#: each rollout starts a toolset server process (33-83 s a test on a loaded 2-core machine)
pytestmark = pytest.mark.timeout(300)

import httpx  # noqa: E402  (verifiers brings it)
from pydantic import ValidationError  # noqa: E402
from verifiers.v1.clients import EvalClientConfig  # noqa: E402
from verifiers.v1.harnesses.null.harness import NullHarnessConfig  # noqa: E402

from toolservices.errors import UserError  # noqa: E402
from toolservices.rollout.testing import Raw, ScriptedChatServer  # noqa: E402
from toolservices.trainers.verifiers import (  # noqa: E402
    TOOLS,
    ToolservicesState,
    ToolservicesToolset,
    ToolservicesToolsetConfig,
    finalize_reward,
    mcp_rollout_url,
)

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE))
from _vf_support import LOG_ENV, LocalNullHarness, LoggedToolset, SeededData  # noqa: E402

sys.path.pop(0)

COUNT = "n = globals().get('n', 0) + 1; print(n)"
PROGRAM = "def add(a, b):\n    return a - b\n\nprint(add(2, 3))\n"
TEST = "from calc import add\nassert add(2, 3) == 5\nprint('ok')\n"


def call(name: str, **args: Any) -> dict[str, Any]:
    return {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": f"call_{uuid.uuid4().hex[:8]}",
                "type": "function",
                "function": {"name": name, "arguments": json.dumps(args)},
            }
        ],
    }


SCRIPT: dict[str, list[Any]] = {
    "count": [call("python", code=COUNT), call("python", code=COUNT), "done"],
    "spin": [call("python", code="while True: pass"), "done"],
    "shell": [
        call("write_file", path="calc.py", content=PROGRAM),
        call("write_file", path="test_calc.py", content=TEST),
        call("bash", command="python3 test_calc.py"),
        call("str_replace", path="calc.py", old_str="a - b", new_str="a + b"),
        call("bash", command="python3 test_calc.py"),
        call("read_file", path="calc.py", start_line=2, end_line=2),
        "done",
    ],
    # the model server breaks down after the first call: the rollout ends in an error
    "broken": [
        call("python", code="print('before')"),
        Raw(body="<html>bad gateway</html>", status=400, content_type="text/html"),
    ],
    "url": [
        call("python_execute", code="x = 20", session_id="s"),
        call("python_execute", code="print(x + 1)", session_id="s"),
        "done",
    ],
    "url-peek": [call("python_execute", code="print(x)", session_id="s"), "done"],
    "oneenv": [
        call("python", code="open('p.txt', 'w').write('from python'); print('written')"),
        call("bash", command="cat p.txt"),
        "done",
    ],
    "seeded": [call("python", code=COUNT), "done"],
    "unseeded": [call("python", code=COUNT), "done"],
    "plain": [call("python", code=COUNT), "done"],
}


@pytest.fixture(scope="module")
def model():
    with ScriptedChatServer(SCRIPT) as server:
        yield server


@pytest.fixture
def lifecycle(tmp_path, monkeypatch) -> Path:
    """The log the test's tool servers write, and their import path."""
    log = tmp_path / "lifecycle.jsonl"
    monkeypatch.setenv(LOG_ENV, str(log))
    path = os.environ.get("PYTHONPATH")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(HERE), path])))
    monkeypatch.setenv("TOOLSERVICES_VF_TEST_KEY", "loopback")
    return log


def events(log: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


def agent(model: ScriptedChatServer, **config: Any) -> Any:
    client = EvalClientConfig(base_url=model.url, api_key_var="TOOLSERVICES_VF_TEST_KEY")
    made = vf.make_agent(
        vf.AgentConfig(model="scripted", runtime=vf.SubprocessConfig(), client=client, **config)
    )
    made.harness = LocalNullHarness(NullHarnessConfig(id="null"))
    return made


def task(prompt: str, toolset: Any) -> Any:
    class OneTask(vf.Task):
        @classmethod
        def toolsets(cls, config: Any) -> list[Any]:
            return [toolset()]

    return OneTask(vf.TaskData(idx=0, prompt=prompt))


def logged(**config: Any) -> Any:
    return lambda: LoggedToolset(ToolservicesToolsetConfig(**config))


def tool_texts(model: ScriptedChatServer, prompt: str) -> list[str]:
    """The tool results the harness sent back to the model in its last request."""
    last = [r for r in model.requests if r["messages"][0]["content"] == prompt][-1]
    return [m["content"] for m in last["messages"] if m["role"] == "tool"]


def assert_all_gone(log: Path) -> None:
    """Every server set up was closed, and no process that served a call survives it."""
    seen = events(log)
    servers = {e["server"] for e in seen if e["event"] == "setup"}
    assert servers and servers == {e["server"] for e in seen if e["event"] == "closed"}
    for entry in (e for e in seen if e["event"] == "call"):
        for pid, started in entry["pids"]:
            try:
                alive = psutil.Process(pid).create_time() == started
            except psutil.NoSuchProcess:
                alive = False
            assert not alive, f"process {pid} that served a {entry['tool']} call outlived it"


async def test_one_python_session_per_rollout_closed_with_it(model, lifecycle):
    async with agent(model) as solver:
        first = await solver.run(task("count", logged(tools=["python"])))
        second = await solver.run(task("count", logged(tools=["python"])))
    for trace in (first, second):
        assert trace.stop_condition == "agent_completed" and not trace.errors
    assert tool_texts(model, "count") == ["1\n", "2\n"]  # the second rollout: a fresh session
    offered = [t["function"]["name"] for t in model.requests[-1]["tools"]]
    assert offered == ["python"]
    assert len({e["server"] for e in events(lifecycle) if e["event"] == "setup"}) == 2
    assert_all_gone(lifecycle)


async def test_concurrent_rollouts_are_isolated(model, lifecycle):
    traces = []
    start = len(model.requests)
    async with agent(model) as solver:

        async def one() -> None:
            traces.append(await solver.run(task("count", logged(tools=["python"]))))

        async with anyio.create_task_group() as tg:
            for _ in range(2):
                tg.start_soon(one)
    assert [t.stop_condition for t in traces] == ["agent_completed"] * 2
    # Requests of the two rollouts interleave; each saw only its own counter.
    seen = [
        [m["content"] for m in r["messages"] if m["role"] == "tool"] for r in model.requests[start:]
    ]
    assert sorted(seen) == [[], [], ["1\n"], ["1\n"], ["1\n", "2\n"], ["1\n", "2\n"]]
    assert_all_gone(lifecycle)


async def test_shell_tools_write_run_fix_and_test(model, lifecycle):
    async with agent(model) as solver:
        trace = await solver.run(task("shell", logged()))
    assert trace.stop_condition == "agent_completed" and not trace.errors
    offered = {t["function"]["name"]: t["function"] for t in model.requests[-1]["tools"]}
    assert sorted(offered) == sorted(TOOLS)
    properties = offered["str_replace"]["parameters"]["properties"]
    assert set(properties) == {"path", "old_str", "new_str"}
    texts = tool_texts(model, "shell")
    assert texts[0].startswith("Wrote ") and texts[1].startswith("Wrote ")
    assert "AssertionError" in texts[2] and "[exit status 1]" in texts[2]
    assert texts[3].startswith("Edited calc.py")
    assert texts[4] == "5\nok\n"  # calc.py prints when imported, then the test passes
    assert texts[5].startswith("     2\t    return a + b")
    assert_all_gone(lifecycle)


async def test_python_in_shell_runs_both_tools_in_one_environment(model, lifecycle):
    async with agent(model) as solver:
        toolset = logged(tools=["python", "bash"], python_in_shell=True)
        trace = await solver.run(task("oneenv", toolset))
    assert trace.stop_condition == "agent_completed" and not trace.errors
    offered = [t["function"]["name"] for t in model.requests[-1]["tools"]]
    assert sorted(offered) == ["bash", "python"]
    assert tool_texts(model, "oneenv") == ["written\n", "from python"]
    assert_all_gone(lifecycle)


async def test_runaway_code_is_stopped_and_the_model_reads_why(model, lifecycle):
    async with agent(model) as solver:
        trace = await solver.run(task("spin", logged(tools=["python"], timeout=1.0)))
    assert trace.stop_condition == "agent_completed"
    (text,) = tool_texts(model, "spin")
    assert "time limit" in text
    assert_all_gone(lifecycle)


async def test_a_rollout_that_fails_still_closes_its_sessions(model, lifecycle):
    """The model server fails on the second turn: the rollout ends in an error,
    and the runtime's teardown ends the tool server, which closes the sandboxes."""
    async with agent(model) as solver:
        trace = await solver.run(task("broken", logged()))
    assert trace.errors and trace.stop_condition != "agent_completed"
    calls = [e for e in events(lifecycle) if e["event"] == "call"]
    assert [c["tool"] for c in calls] == ["python"] and calls[0]["pids"]
    assert_all_gone(lifecycle)


def hooked_task(prompt: str, start: int, **hooks: str) -> Any:
    """A task declaring ToolservicesState, with finalize_reward plugged as its reward
    (the way a config does it) and a python toolset with ``hooks``."""

    class HookedTask(vf.Task[SeededData, ToolservicesState]):
        @classmethod
        def toolsets(cls, config: Any) -> list[Any]:
            return [LoggedToolset(ToolservicesToolsetConfig(tools=["python"], **hooks))]

    rewards = {"tests": {"fn": "toolservices.trainers.verifiers:finalize_reward"}}
    return HookedTask(SeededData(idx=0, prompt=prompt, start=start), vf.TaskConfig(rewards=rewards))


def plain_task(prompt: str, **hooks: str) -> Any:
    """A task with verifiers' own State (no field for finalize's value)."""

    class PlainTask(vf.Task[SeededData]):
        @classmethod
        def toolsets(cls, config: Any) -> list[Any]:
            return [LoggedToolset(ToolservicesToolsetConfig(tools=["python"], **hooks))]

    return PlainTask(SeededData(idx=0, prompt=prompt, start=3))


async def test_setup_seeds_from_the_task_and_finalize_is_the_reward(model, lifecycle):
    """setup gets the rollout's task data as the episode's state and seeds the
    session; finalize reads the final session when the toolset ends, its value
    reaches trace.state through verifiers' state channel, and the task's
    plugged reward scores the rollout with it. A failed setup: the tools say
    so, the error is in the state, the reward is 0.0."""
    async with agent(model) as solver:
        seeded = await solver.run(
            hooked_task("seeded", 40, setup="_hooks:seed", finalize="_hooks:score")
        )
        broken = await solver.run(
            hooked_task("unseeded", 1, setup="_hooks:broken", finalize="_hooks:score")
        )
        # a task whose state has no room for the value: the rollout is unharmed
        plain = await solver.run(plain_task("plain", setup="_hooks:seed", finalize="_hooks:score"))
    assert seeded.stop_condition == "agent_completed" and not seeded.errors
    assert tool_texts(model, "seeded") == ["41\n"]
    assert seeded.state.toolservices_outcome == 41.0 and seeded.state.toolservices_error is None
    assert seeded.rewards["tests"].score == 41.0 and seeded.reward == 41.0
    (refusal,) = tool_texts(model, "unseeded")
    assert "could not be set up" in refusal
    assert broken.state.toolservices_error == "setup failed: RuntimeError: no repository to seed"
    assert broken.rewards["tests"].score == 0.0 and broken.reward == 0.0
    assert plain.stop_condition == "agent_completed" and not plain.errors
    assert tool_texts(model, "plain") == ["4\n"]
    assert not hasattr(plain.state, "toolservices_outcome")
    assert_all_gone(lifecycle)


async def test_finalize_reward_takes_numbers_and_scores_and_names_the_fix():
    class Trace:  # finalize_reward reads the trace's state only
        def __init__(self, state: Any) -> None:
            self.state = state

    assert await finalize_reward(Trace(ToolservicesState(toolservices_outcome=True))) == 1.0
    report = ToolservicesState(toolservices_outcome={"score": 0.5, "passed": 1})
    assert await finalize_reward(Trace(report)) == 0.5
    assert await finalize_reward(Trace(ToolservicesState())) == 0.0
    with pytest.raises(UserError, match="without a numeric 'score'"):
        await finalize_reward(Trace(ToolservicesState(toolservices_outcome={"passed": 1})))
    with pytest.raises(UserError, match="ToolservicesState"):
        await finalize_reward(Trace(vf.State()))


def test_the_config_names_the_valid_tools():
    with pytest.raises(ValidationError, match="valid: python, bash, read_file"):
        ToolservicesToolsetConfig(tools=["python", "nope"])
    with pytest.raises(ValidationError, match="timeout must be positive"):
        ToolservicesToolsetConfig(timeout=0)


async def test_a_shared_server_is_refused(monkeypatch):
    """Taskset-scoped servers get no per-rollout state channel: one set of
    sessions would serve every rollout, so setup says where to put the toolset."""
    monkeypatch.delenv("VF_STATE_URL", raising=False)
    toolset = ToolservicesToolset(ToolservicesToolsetConfig(tools=["python"]))
    with pytest.raises(vf.ToolsetError, match=r"Task\.toolsets"):
        await toolset.setup()


REPO = HERE.parents[1]
#: ``toolservices serve --mcp`` needs a newer MCP SDK than the 2.0.0 verifiers 0.4 pins: the
#: server runs from the main venv (CI builds it first), as in production: its own process.
SERVER_BIN = Path(os.environ.get("TOOLSERVICES_MCP_BIN", REPO / ".venv" / "bin" / "toolservices"))
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
    ready = threading.Event()
    found: list[str] = []
    seen: list[str] = []

    def pump() -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            seen.append(line)
            if "ready:" in line and not found:
                found.append(line.split("ready:", 1)[1].strip())
                ready.set()
        ready.set()

    pumping = threading.Thread(target=pump, daemon=True)
    pumping.start()
    try:
        assert ready.wait(120) and found, f"MCP server did not start: {''.join(seen)}"
        yield found[0]
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


async def test_our_mcp_server_by_url_one_namespace_per_rollout(mcp_server_url, model, monkeypatch):
    """The other route: a shared ``serve --mcp --session-scope namespace`` server,
    each rollout's toolset given a URL with the token and a fresh namespace."""

    class ToolservicesPython(vf.Toolset[vf.ToolsetConfig]):
        TOOL_PREFIX = None  # keep the server's tool names (python_execute, ...)

    first_url = mcp_rollout_url(mcp_server_url, token=MCP_TOKEN)

    def by_url(url: str) -> Any:
        return lambda: ToolservicesPython(vf.ToolsetConfig(url=url))

    monkeypatch.setenv("TOOLSERVICES_VF_TEST_KEY", "loopback")
    async with agent(model) as solver:
        trace = await solver.run(task("url", by_url(first_url)))
        assert trace.stop_condition == "agent_completed"
        results = [json.loads(t) for t in tool_texts(model, "url")]
        assert results[1]["stdout"] == "21\n"  # two calls, two connections, one session
        other = mcp_rollout_url(mcp_server_url, token=MCP_TOKEN)
        await solver.run(task("url-peek", by_url(other)))
        (peek,) = [json.loads(t) for t in tool_texts(model, "url-peek")]
        assert peek["exception"]["type"] == "NameError"  # another namespace
        await solver.run(task("url-peek", by_url(first_url)))
        (again,) = [json.loads(t) for t in tool_texts(model, "url-peek")]
        assert again["stdout"] == "20\n"
    async with httpx.AsyncClient() as client:  # without the token the server refuses
        assert (await client.post(mcp_server_url, json={})).status_code == 401


def test_mcp_rollout_url_adds_the_token_and_a_fresh_namespace():
    base = "http://127.0.0.1:8765/mcp?keep=1&namespace=old"
    one, two = mcp_rollout_url(base, token="t" * 20), mcp_rollout_url(base, token="t" * 20)
    assert one != two  # a fresh namespace each call: one per rollout
    assert one.startswith("http://127.0.0.1:8765/mcp?keep=1&access_token=tttt")
    assert "namespace=old" not in one and "namespace=vf-" in one
    assert mcp_rollout_url(base, token="t" * 20, namespace="r-7").endswith("&namespace=r-7")
