"""verl adapter: YAML tool configs through verl's loader, its agent loop driving our tool.

Needs verl, whose pins (tensordict<=0.10, transformers<5.11) conflict with the
main venv's torchrl: .ci/run runs this file in .venv-verl.
"""

from __future__ import annotations

import re
import sys
import textwrap
import warnings
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("verl")
torch = pytest.importorskip("torch")

# Run in a venv of their own (.ci/run), where their durations were not measured
# against the suite's 60 s: they keep the bound they had.
pytestmark = pytest.mark.timeout(300)

with warnings.catch_warnings():  # verl imports Ray's deprecated state API
    warnings.simplefilter("ignore", DeprecationWarning)
    import hydra
    from omegaconf import OmegaConf
    from verl.experimental.agent_loop.agent_loop import (
        AgentLoopMetrics,
        AgentLoopOutput,
        DictConfigWrap,
        ToolListWrap,
        _agent_loop_registry,
    )
    from verl.tools.tool_registry import initialize_tools_from_config
    from verl.workers.rollout.replica import TokenOutput

    from toolservices.errors import UserError
    from toolservices.trainers import verl as verl_adapter
    from toolservices.trainers.verl import (
        ToolservicesAgentLoop,
        ToolservicesTool,
        shared_executor,
        shared_shell,
    )

sys.path.insert(0, str(Path(__file__).parent))
import _hooks as hooks  # noqa: E402
from _tiny_lm import HERMES_TEMPLATE, build  # noqa: E402

sys.path.pop(0)

EXECUTOR = {"pool_size": 2, "timeout": 2.0}
CLASS = "toolservices.trainers.verl.ToolservicesTool"


class LocalModelServer:
    """verl's server-manager interface (``generate``) served by a local HF model on CPU."""

    def __init__(self, model: Any, fail_after: int | None = None) -> None:
        self.model = model
        self.calls = 0
        self.fail_after = fail_after

    async def generate(
        self, request_id: str, prompt_ids: list[int], sampling_params: dict, **_: Any
    ):
        self.calls += 1
        if self.fail_after is not None and self.calls > self.fail_after:
            raise RuntimeError("inference server went away")
        ids = torch.tensor([prompt_ids])
        out = self.model.generate(
            ids, attention_mask=torch.ones_like(ids), max_new_tokens=8, do_sample=False
        )
        new = out[0, ids.shape[1] :].tolist()
        return TokenOutput(token_ids=new, log_probs=[0.0] * len(new), stop_reason="completed")


@pytest.fixture(scope="module")
def tiny():
    return build(HERMES_TEMPLATE)


@pytest.fixture
def executor():
    ex = shared_executor(**EXECUTOR)
    yield ex
    assert ex.stats()["sessions"] == 0, "a trajectory leaked a Python session"


def rollout_config(**multi_turn: Any):
    turns = {
        "max_user_turns": 2,
        "max_assistant_turns": 3,
        "max_parallel_calls": 1,
        "max_tool_response_length": 256,
        "tool_response_truncate_side": "middle",
        "format": "hermes",
        **multi_turn,
    }
    return OmegaConf.create(
        {
            "actor_rollout_ref": {
                "rollout": {
                    "prompt_length": 1024,
                    "response_length": 512,
                    "full_determinism": False,
                    "multi_turn": turns,
                }
            },
            "data": {},
        }
    )


def make_loop(name: str, tiny, tools, server=None, **multi_turn: Any):
    model, tokenizer = tiny
    config = rollout_config(**multi_turn)
    return hydra.utils.instantiate(
        config=_agent_loop_registry[name],
        trainer_config=DictConfigWrap(config),
        server_manager=server or LocalModelServer(model),
        tokenizer=tokenizer,
        processor=None,
        hf_model_type="qwen2",
        dataset_cls=None,
        data_config=DictConfigWrap(config.data),
        tools=ToolListWrap(tools),
    )


def tool_results(tokenizer, output) -> list[str]:
    text = tokenizer.decode(output.response_ids).replace("[UNK]", "")  # e.g. print()'s newline
    return re.findall(r"<tool_response>\n(.*?)\n</tool_response>", text, re.DOTALL)


def write_yaml(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "tools.yaml"
    path.write_text(textwrap.dedent(body))
    return path


def python_tool_config() -> dict[str, Any]:
    return {"type": "native", "tool": "python", "executor": EXECUTOR, "timeout": 5}


def test_yaml_config_builds_our_tools_with_their_schemas(tmp_path, executor):
    path = write_yaml(
        tmp_path,
        f"""
        tools:
          - class_name: toolservices.trainers.verl.ToolservicesTool
            config:
              type: native
              tool: python
              executor: {{pool_size: {EXECUTOR["pool_size"]}, timeout: {EXECUTOR["timeout"]}}}
          - class_name: toolservices.trainers.verl.ToolservicesTool
            config:
              type: native
              tool: "toolservices.cli._demo_tools:get_weather"
            tool_schema: null
        """,
    )
    python, weather = initialize_tools_from_config(str(path))
    assert isinstance(python, ToolservicesTool) and python.name == "python"
    assert python.tool.executor is executor  # one executor per worker process
    schema = python.tool_schema.model_dump(exclude_unset=True, exclude_none=True)
    assert schema["function"]["parameters"]["required"] == ["code"]
    unit = weather.tool_schema.function.parameters.properties["unit"]
    assert unit.type == "string" and unit.enum == ["celsius", "fahrenheit"]
    assert weather.tool_schema.function.parameters.required == ["city"]


@pytest.mark.anyio
async def test_agent_loop_keeps_one_session_per_trajectory(tiny, executor):
    """verl's ToolAgentLoop code generates, parses hermes calls and calls our tool.

    The model writes the same counter snippet each turn: within a trajectory
    it counts 1, 2 (one session); the next trajectory starts at 1 again.
    """
    tool = ToolservicesTool(python_tool_config(), None)
    first = await make_loop("toolservices_agent", tiny, [tool]).run(
        {}, raw_prompt=[{"role": "user", "content": "count"}]
    )
    assert tool_results(tiny[1], first) == ["1", "2"]
    assert executor.stats()["sessions"] == 0  # closed when the trajectory ended
    second = await make_loop("toolservices_agent", tiny, [tool]).run(
        {}, raw_prompt=[{"role": "user", "content": "count"}]
    )
    assert tool_results(tiny[1], second) == ["1", "2"]
    assert second.extra_fields["tool_rewards"] == [0.0, 0.0]


@pytest.mark.anyio
async def test_parallel_calls_of_one_turn_run_in_order_in_one_session(executor):
    """verl gathers a turn's calls concurrently; the episode takes them one at a time."""
    two_calls = build(HERMES_TEMPLATE, calls_per_turn=2)
    tool = ToolservicesTool(python_tool_config(), None)
    out = await make_loop("toolservices_agent", two_calls, [tool], max_parallel_calls=2).run(
        {}, raw_prompt=[{"role": "user", "content": "count"}]
    )
    assert tool_results(two_calls[1], out) == ["1", "2", "3", "4"]


@pytest.mark.anyio
async def test_sessions_close_when_a_trajectory_fails(tiny, executor):
    tool = ToolservicesTool(python_tool_config(), None)
    server = LocalModelServer(tiny[0], fail_after=1)  # one tool call, then the server dies
    with pytest.raises(RuntimeError, match="went away"):
        await make_loop("toolservices_agent", tiny, [tool], server=server).run(
            {}, raw_prompt=[{"role": "user", "content": "count"}]
        )
    assert executor.stats()["sessions"] == 0


@pytest.mark.anyio
async def test_under_verls_own_loop_each_call_is_fresh_and_released(tiny, executor):
    """Without our loop there is no trajectory to key on: verl's per-call lifecycle."""
    assert issubclass(ToolservicesAgentLoop, type(make_loop("tool_agent", tiny, [])))
    tool = ToolservicesTool(python_tool_config(), None)
    out = await make_loop("tool_agent", tiny, [tool]).run(
        {}, raw_prompt=[{"role": "user", "content": "count"}]
    )
    assert tool_results(tiny[1], out) == ["1", "1"]


@pytest.mark.anyio
async def test_a_hanging_tool_times_out(monkeypatch):
    monkeypatch.syspath_prepend(str(Path(__file__).parent))  # verl imports _hang_tool by name
    tool = ToolservicesTool({"type": "native", "tool": "_hang_tool:hang", "timeout": 0.5}, None)
    instance, _ = await tool.create()
    response, reward, metrics = await tool.execute(instance, {"seconds": 1})
    assert "timed out" in response.text.lower()
    assert metrics == {"failed": True, "timed_out": True}
    await tool.release(instance)


@pytest.mark.anyio
async def test_runaway_python_is_killed_inside_a_trajectory(executor):
    tool = ToolservicesTool(python_tool_config(), None)
    instance, _ = await tool.create()
    response, _, metrics = await tool.execute(instance, {"code": "while True: pass"})
    assert "time limit" in response.text and metrics["timed_out"] is True
    assert metrics["failed"] is True
    await tool.release(instance)
    assert await tool.calc_reward(instance) == 0.0


@pytest.mark.anyio
async def test_shell_tools_share_one_session_per_trajectory(tmp_path):
    """bash and write_file from YAML: in one trajectory they act on one shell session,
    another trajectory gets its own, and both end with their trajectory."""
    path = write_yaml(
        tmp_path,
        """
        tools:
          - class_name: toolservices.trainers.verl.ToolservicesTool
            config: {type: native, tool: write_file, shell: {pool_size: 1, timeout: 10}}
          - class_name: toolservices.trainers.verl.ToolservicesTool
            config: {type: native, tool: bash, shell: {pool_size: 1, timeout: 10}}
        """,
    )
    write, bash = initialize_tools_from_config(str(path))
    shell = shared_shell(pool_size=1, timeout=10)
    assert write.tool.shell is shell and bash.tool.shell is shell
    assert write.tool_schema.function.parameters.required == ["path", "content"]

    class Request:  # what the agent loop hands a tool as agent_data
        def __init__(self, request_id: str) -> None:
            self.request_id = request_id

    async def run(tool: Any, request: Request, args: dict[str, Any]) -> str:
        instance, _ = await tool.create()
        response, _, _ = await tool.execute(instance, args, agent_data=request)
        await tool.release(instance)
        return str(response.text)

    one, two = verl_adapter._Trajectory(), verl_adapter._Trajectory()  # two loop runs
    try:
        token = verl_adapter._TRAJECTORY.set(one)  # what ToolservicesAgentLoop.run sets up
        assert (await run(write, Request("r1"), {"path": "a.txt", "content": "hi"})).startswith(
            "Wrote"
        )
        assert await run(bash, Request("r1"), {"command": "cat a.txt"}) == "hi"
        verl_adapter._TRAJECTORY.reset(token)
        token = verl_adapter._TRAJECTORY.set(two)
        assert "No such file" in await run(bash, Request("r2"), {"command": "cat a.txt"})
        verl_adapter._TRAJECTORY.reset(token)
        assert shell.stats()["sessions"] == 2
    finally:
        await one.aclose()
        await two.aclose()
    assert shell.stats()["sessions"] == 0


async def test_python_in_shell_shares_the_trajectorys_shell_session(tmp_path):
    """tool: python with python_in_shell: the code runs in the trajectory's shell session,
    so a file it writes is there for bash, whichever of the two starts the episode."""
    path = write_yaml(
        tmp_path,
        """
        tools:
          - class_name: toolservices.trainers.verl.ToolservicesTool
            config: {type: native, tool: python, python_in_shell: true,
                     shell: {pool_size: 1, timeout: 10}}
          - class_name: toolservices.trainers.verl.ToolservicesTool
            config: {type: native, tool: bash, shell: {pool_size: 1, timeout: 10}}
        """,
    )
    python, bash = initialize_tools_from_config(str(path))
    shell = shared_shell(pool_size=1, timeout=10)
    assert python.tool.shell is shell and python.group == bash.group
    assert python.tool_schema.function.parameters.required == ["code"]

    async def run(tool: Any, args: dict[str, Any]) -> str:
        instance, _ = await tool.create()
        response, _, _ = await tool.execute(instance, args, agent_data=None)
        await tool.release(instance)
        return str(response.text)

    for first in ("bash", "python"):  # either tool may make the trajectory's episode
        trajectory = verl_adapter._Trajectory()
        token = verl_adapter._TRAJECTORY.set(trajectory)
        try:
            if first == "bash":
                assert "ok" in await run(bash, {"command": "echo ok"})
            code = "open('p.txt', 'w').write('py'); print('written')"
            assert "written" in await run(python, {"code": code})
            assert await run(bash, {"command": "cat p.txt"}) == "py"
        finally:
            verl_adapter._TRAJECTORY.reset(token)
            await trajectory.aclose()
    assert shell.stats()["sessions"] == 0
    with pytest.raises(UserError, match="keeps its name 'python'"):
        ToolservicesTool(
            {"type": "native", "tool": "python", "python_in_shell": True, "name": "py"}, None
        )


def hooked_yaml(tmp_path: Path, **hooks: str) -> Path:
    """A tools.yaml with the python tool and ``hooks`` (``setup=``, ``finalize=``) in its config."""
    config = {"type": "native", "tool": "python", "executor": EXECUTOR, **hooks}
    path = tmp_path / "tools.yaml"
    path.write_text(OmegaConf.to_yaml({"tools": [{"class_name": CLASS, "config": config}]}))
    return path


@pytest.fixture
def hooks_importable(monkeypatch):
    monkeypatch.syspath_prepend(str(Path(__file__).parent))  # "_hooks:seed" is imported by name


def row(start: int) -> dict[str, Any]:
    """What verl's worker passes a loop for one dataset row."""
    return {
        "raw_prompt": [{"role": "user", "content": "count"}],
        "tools_kwargs": {"python": {"create_kwargs": {"start": start}}},
    }


@pytest.mark.anyio
async def test_setup_seeds_each_trajectory_and_finalize_is_its_reward(
    tmp_path, tiny, executor, hooks_importable
):
    """setup (from YAML) seeds the trajectory's session from the row's create_kwargs
    before the first turn; the model's calls count on from there; finalize reads
    the final session and its value is verl's reward_score (rm_scores at the last
    token), so verl skips its reward function for the trajectory."""
    path = hooked_yaml(tmp_path, setup="_hooks:seed", finalize="_hooks:score")
    (tool,) = initialize_tools_from_config(str(path))
    first = await make_loop("toolservices_agent", tiny, [tool]).run({}, **row(40))
    second = await make_loop("toolservices_agent", tiny, [tool]).run({}, **row(7))
    assert tool_results(tiny[1], first) == ["41", "42"]
    assert tool_results(tiny[1], second) == ["8", "9"]
    assert (first.reward_score, second.reward_score) == (42.0, 9.0)
    assert first.extra_fields["toolservices"] == {"outcome": 42.0, "errors": {}}
    scores = first.as_dict()["rm_scores"]  # verl's own conversion for its trainer
    assert scores[-1].item() == 42.0 and scores[:-1].abs().sum().item() == 0.0
    assert executor.stats()["sessions"] == 0


@pytest.mark.anyio
async def test_a_failed_setup_is_reported_and_scores_zero(
    tmp_path, tiny, executor, hooks_importable
):
    path = hooked_yaml(tmp_path, setup="_hooks:broken", finalize="_hooks:score")
    (tool,) = initialize_tools_from_config(str(path))
    out = await make_loop("toolservices_agent", tiny, [tool]).run({}, **row(1))
    # the refusal's words are not in the tiny vocabulary: no count, the code never ran
    assert tool_results(tiny[1], out) == ["", ""]
    assert out.reward_score == 0.0
    assert out.extra_fields["toolservices"]["errors"] == {
        "python": "setup failed: RuntimeError: no repository to seed"
    }


@pytest.mark.anyio
async def test_finalize_details_reach_verls_reward_function(
    tmp_path, tiny, executor, hooks_importable
):
    """A mapping with a "score" is the reward; one without is left to verl's reward
    function, which reads it from extra_fields (extra_info["toolservices"])."""
    (scored,) = initialize_tools_from_config(
        str(hooked_yaml(tmp_path, setup="_hooks:seed", finalize="_hooks:report"))
    )
    out = await make_loop("toolservices_agent", tiny, [scored]).run({}, **row(3))
    assert out.reward_score == 5.0
    assert out.extra_fields["toolservices"]["outcome"] == {"score": 5.0, "passed": ["counter"]}
    (unscored,) = initialize_tools_from_config(
        str(hooked_yaml(tmp_path, finalize="_hooks:details"))
    )
    out = await make_loop("toolservices_agent", tiny, [unscored]).run({}, **row(3))
    assert out.reward_score is None  # verl calls the reward function for this one
    assert out.extra_fields["toolservices"]["outcome"] == {"counter": 2.0}
    assert executor.stats()["sessions"] == 0


@pytest.mark.anyio
async def test_two_rewards_for_one_trajectory_are_refused(tiny, executor):
    first = ToolservicesTool({**python_tool_config(), "finalize": hooks.score}, None)
    second = ToolservicesTool(
        {**python_tool_config(), "name": "python2", "finalize": hooks.report}, None
    )
    with pytest.raises(hydra.errors.InstantiationException, match="each name a finalize") as info:
        make_loop("toolservices_agent", tiny, [first, second])  # verl builds loops with hydra
    assert isinstance(info.value.__cause__, UserError)


@pytest.mark.anyio
async def test_under_verls_own_loop_calc_reward_is_finalize(executor):
    """verl's stock lifecycle (create, execute, calc_reward, release) on one instance."""
    config = {**python_tool_config(), "setup": hooks.seed, "finalize": hooks.report}
    tool = ToolservicesTool(config, None)
    instance, _ = await tool.create(create_kwargs={"start": 5})
    response, _, _ = await tool.execute(instance, {"code": "n += 1; print(n)"})
    assert response.text.strip() == "6"
    assert await tool.calc_reward(instance) == 6.0
    await tool.release(instance)
    assert executor.stats()["sessions"] == 0


@pytest.mark.anyio
async def test_shell_hooks_seed_and_score_the_groups_one_session(tmp_path, hooks_importable):
    """Hooks named on bash serve the worker's shell tools' one episode: setup seeds the
    repository before the first turn, write_file (no hooks of its own) fixes it, and
    finalize's hidden test on the final workspace is the reward."""
    hooks = {"setup": "_hooks:seed_repo", "finalize": "_hooks:hidden_tests"}
    shell = {"pool_size": 1, "timeout": 10}
    tools = [
        {"class_name": CLASS, "config": {"type": "native", "tool": "write_file", "shell": shell}},
        {
            "class_name": CLASS,
            "config": {"type": "native", "tool": "bash", "shell": shell, **hooks},
        },
    ]
    path = tmp_path / "tools.yaml"
    path.write_text(OmegaConf.to_yaml({"tools": tools}))
    write, bash = initialize_tools_from_config(str(path))
    assert verl_adapter._hooked_tools([write, bash]) == [bash]

    class Request:
        request_id = "r1"

    trajectory = verl_adapter._Trajectory()
    token = verl_adapter._TRAJECTORY.set(trajectory)
    try:
        await trajectory.start([bash], {})
        instance, _ = await bash.create()
        seeded, _, _ = await bash.execute(
            instance, {"command": "cat calc.py"}, agent_data=Request()
        )
        await bash.release(instance)
        assert "return a - b" in seeded.text  # setup ran before the first call
        instance, _ = await write.create()
        fixed = "def add(a, b):\n    return a + b\n"
        args = {"path": "calc.py", "content": fixed}
        await write.execute(instance, args, agent_data=Request())
        await write.release(instance)
        output = AgentLoopOutput(
            prompt_ids=[1], response_ids=[2], response_mask=[1], metrics=AgentLoopMetrics()
        )
        await trajectory.score(output)
    finally:
        verl_adapter._TRAJECTORY.reset(token)
        await trajectory.aclose()
    assert output.reward_score == 1.0
    assert shared_shell(**shell).stats()["sessions"] == 0

    other = ToolservicesTool(
        {"type": "native", "tool": "write_file", "shell": shell, "setup": hooks["finalize"]}, None
    )
    with pytest.raises(UserError, match="share one shell session"):
        verl_adapter._hooked_tools([bash, other])
