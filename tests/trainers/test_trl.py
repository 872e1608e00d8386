"""TRL adapter: schemas through transformers' builder, episodes, timeouts, a real GRPOTrainer run.

Runs wherever TRL is installed (the main CI venv has it through the ``all`` extra).
"""

from __future__ import annotations

import inspect
import json
import os
import sys
from pathlib import Path
from typing import Literal

import pytest

pytest.importorskip("trl")
transformers = pytest.importorskip("transformers")

from transformers.utils import get_json_schema  # noqa: E402

from toolservices import tool  # noqa: E402
from toolservices.env import python_tool  # noqa: E402
from toolservices.errors import UserError  # noqa: E402
from toolservices.trainers.trl import trl_environment  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))
from _hang_tool import hang  # noqa: E402

sys.path.pop(0)


@tool
def lookup(
    query: str,
    limit: int = 3,
    mode: Literal["exact", "fuzzy"] = "exact",
    tags: list[str] | None = None,
) -> str:
    """Look a word up in the glossary.

    Args:
        query: The word to look up.
        limit: How many entries to return.
        mode: How to match the word.
        tags: Only entries with one of these tags.
    """
    return f"{query}|{limit}|{mode}|{tags}"


@tool
def whoami(value: str, _state: dict) -> str:
    """Say which rollout this is and what its dataset row holds.

    Args:
        value: Echoed back.
    """
    return f"{_state['episode_id']}|{_state.get('answer')}|{value}"


def trl_tool_methods(env_cls: type) -> list[str]:
    """The methods TRL turns into tools (its own rule: public functions but reset/get_reward)."""
    return [
        name
        for name, _ in inspect.getmembers(env_cls, predicate=inspect.isfunction)
        if name not in ("reset", "get_reward") and not name.startswith("_")
    ]


def test_transformers_reads_the_schema_of_each_tool(executor):
    Env = trl_environment([lookup, python_tool(executor)])
    env = Env()
    assert trl_tool_methods(Env) == ["lookup", "python"]
    schema = get_json_schema(env.lookup)["function"]
    assert schema["name"] == "lookup"
    assert schema["description"] == "Look a word up in the glossary."
    params = schema["parameters"]
    assert params["required"] == ["query"]
    assert params["properties"]["query"] == {
        "type": "string",
        "description": "The word to look up.",
    }
    assert params["properties"]["limit"] == {
        "type": "integer",
        "description": "How many entries to return.",
    }
    assert params["properties"]["mode"] == {
        "type": "string",
        "enum": ["exact", "fuzzy"],
        "description": "How to match the word.",
    }
    assert params["properties"]["tags"]["type"] == "array"
    assert params["properties"]["tags"]["items"] == {"type": "string"}
    assert params["properties"]["tags"]["nullable"] is True
    py = get_json_schema(env.python)["function"]
    assert py["parameters"]["required"] == ["code"]
    assert py["parameters"]["properties"]["code"]["type"] == "string"
    # The _state parameter is the adapter's business, never the model's.
    with_state = trl_environment([whoami])
    assert "_state" not in json.dumps(get_json_schema(with_state().whoami))
    Env.close_all()


def test_a_tool_call_runs_with_the_arguments_given():
    Env = trl_environment([lookup])
    env = Env()
    env.reset(prompt=[{"role": "user", "content": "hi"}])
    assert env.lookup(query="cat") == "cat|3|exact|None"
    assert env.lookup(query="cat", limit=1, tags=["a"]) == "cat|1|exact|['a']"
    # Bad arguments come back as text the model reads, not as an exception.
    assert "Error" in env.lookup(query="cat", limit="many")
    Env.close_all()


def test_state_is_kept_within_a_rollout_and_never_across(executor):
    Env = trl_environment([whoami, python_tool(executor)])
    env = Env()
    env.reset(prompt="one", answer="42")
    first_id = env.episode.id
    assert env.whoami(value="a") == f"{first_id}|42|a"
    assert env.python(code="x = 5") == ""
    assert env.python(code="print(x)").strip() == "5"
    first_session = env.episode.python_session
    assert executor.stats()["sessions"] == 1

    env.reset(prompt="two")  # TRL reuses instances across rollouts
    assert env.whoami(value="c") == f"{env.episode.id}|None|c"
    assert env.episode.id != first_id
    assert "NameError" in env.python(code="print(x)")
    assert env.episode.python_session != first_session
    assert executor.stats()["sessions"] == 1  # the first rollout's session was closed

    other = Env()  # a concurrent rollout has its own episode
    other.reset(prompt="three")
    assert "NameError" in other.python(code="print(x)")
    assert executor.stats()["sessions"] == 2
    Env.close_all()
    assert executor.stats()["sessions"] == 0


def test_a_hanging_tool_times_out():
    Env = trl_environment([hang], timeout=0.5)
    env = Env()
    env.reset()
    text = env.hang(seconds=1.0)
    assert "timed out" in text.lower()
    Env.close_all()


def test_runaway_python_is_killed_and_the_model_is_told(executor):
    Env = trl_environment([python_tool(executor)])
    env = Env()
    env.reset()
    env.python(code="y = 1")
    text = env.python(code="while True: pass")
    assert "time limit" in text and "restarted" in text
    assert env.python(code="print(globals().get('y'))").strip() == "None"
    Env.close_all()


def test_reward_comes_from_the_episode():
    Env = trl_environment([whoami], reward=lambda ep: float(len(ep.messages)))
    env = Env()
    env.reset()
    env.whoami(value="a")
    assert env.get_reward() == 2.0  # one assistant turn, one tool message
    assert "get_reward" not in trl_tool_methods(Env)
    assert not hasattr(trl_environment([whoami]), "get_reward")


def test_max_calls_ends_the_episode_in_text():
    Env = trl_environment([lookup], max_calls=1)
    env = Env()
    env.reset()
    assert env.lookup(query="a") == "a|3|exact|None"
    assert "episode has ended" in env.lookup(query="b")


def test_names_trl_would_misread_are_refused():
    @tool
    def reset(x: int) -> int:
        """Reset.

        Args:
            x: X.
        """
        return x

    with pytest.raises(UserError, match="reserved"):
        trl_environment([reset])
    with pytest.raises(UserError, match="at least one tool"):
        trl_environment([])


@pytest.mark.slow
@pytest.mark.timeout(180)  # trains a tiny model for a few GRPO steps (~30 s on a busy machine)
@pytest.mark.filterwarnings("ignore::FutureWarning")
@pytest.mark.filterwarnings("ignore::UserWarning")
def test_grpo_trainer_drives_the_environment(executor, tmp_path, monkeypatch):
    """GRPOTrainer's own generation and tool-calling loop with a tiny local model.

    The model writes the same python call every turn (see ``_tiny_lm``): a
    counter kept in the session. Each rollout must count 1, 2 (state within
    its episode), and a new rollout starts again at 1 (no state across).
    """
    monkeypatch.setenv("TRL_EXPERIMENTAL_SILENCE", "1")
    monkeypatch.setenv("WANDB_DISABLED", "true")
    sys.path.insert(0, str(Path(__file__).parent))
    try:
        from _tiny_lm import build
    finally:
        sys.path.pop(0)
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer
    from trl.chat_template_utils import qwen3_instruct_2507_chat_template

    model, tokenizer = build(qwen3_instruct_2507_chat_template)
    finished = []

    def reward(episode):
        finished.append([m["content"].strip() for m in episode.messages if m["role"] == "tool"])
        return float(finished[-1][-1]) if finished[-1] else 0.0

    Env = trl_environment([python_tool(executor)], reward=reward)
    dataset = Dataset.from_list([{"prompt": [{"role": "user", "content": "count"}]}] * 4)
    args = GRPOConfig(
        output_dir=str(tmp_path),
        per_device_train_batch_size=2,
        num_generations=2,
        max_steps=2,
        max_completion_length=200,
        max_tool_calling_iterations=2,
        report_to="none",
        use_cpu=True,
        save_strategy="no",
        logging_steps=1,
        dataloader_num_workers=0,
    )
    trainer = GRPOTrainer(
        model=model,
        args=args,
        train_dataset=dataset,
        processing_class=tokenizer,
        environment_factory=Env,
    )
    trainer.train()
    # Two steps of two rollouts; each rollout ran two calls in its own session.
    assert finished == [["1", "2"]] * 4
    history = [h for h in trainer.state.log_history if "tools/call_frequency" in h]
    assert history and all(h["tools/failure_frequency"] == 0 for h in history)
    Env.close_all()
    assert executor.stats()["sessions"] == 0
    assert os.environ["TRL_EXPERIMENTAL_SILENCE"] == "1"


def test_setup_seeds_from_the_row_and_finalize_is_the_reward():
    from toolservices import shell_tools
    from toolservices.shell import ShellService

    def setup(episode):
        episode.shell.write_file(
            "task.txt", episode.state["task"], session_id=episode.shell_session
        )
        if episode.state["task"] == "broken":
            raise OSError("cannot seed")

    def finalize(episode):
        res = episode.shell.run("test -f answer.txt", session_id=episode.shell_session)
        return 1.0 if res.returncode == 0 else 0.0

    with ShellService(pool_size=1, timeout=10.0) as shell:
        Env = trl_environment(shell_tools(shell), setup=setup, finalize=finalize)
        env = Env()
        try:
            env.reset(task="write answer.txt")
            assert env.bash(command="cat task.txt").startswith("write answer.txt")
            assert env.get_reward() == 0.0
            env.reset(task="write answer.txt")
            env.bash(command="touch answer.txt")
            assert env.get_reward() == 1.0 and env.episode.outcome == 1.0
            env.reset(task="broken")
            assert "could not be set up" in env.bash(command="ls")
            assert env.episode.error == "setup failed: OSError: cannot seed"
            assert env.get_reward() == 0.0
        finally:
            Env.close_all()
        assert shell.stats()["sessions"] == 0


def test_python_on_the_shell_shares_the_rollouts_session():
    """python_tool(shell=...) beside bash: no adapter option, one environment per rollout."""
    from toolservices import python_tool, shell_tools
    from toolservices.shell import ShellService

    with ShellService(pool_size=1, timeout=10.0) as shell:
        Env = trl_environment([python_tool(shell=shell), *shell_tools(shell)])
        env = Env()
        try:
            env.reset()
            env.python(code="open('p.txt', 'w').write('from python')")
            assert env.bash(command="cat p.txt") == "from python"
            env.reset()  # a new rollout: a new session
            assert "No such file" in env.bash(command="cat p.txt")
        finally:
            Env.close_all()
        assert shell.stats()["sessions"] == 0


def test_a_score_mapping_is_the_reward_and_other_values_say_so():
    outcomes = iter([{"score": 0.5, "passed": 3}, "three tests passed"])
    Env = trl_environment([lookup], finalize=lambda episode: next(outcomes))
    env = Env()
    try:
        env.reset()
        assert env.get_reward() == 0.5  # verl's form: the score, with its details beside it
        env.reset()
        with pytest.raises(UserError, match="no reward: return a number or a mapping"):
            env.get_reward()
    finally:
        Env.close_all()
