"""Episode lifecycle hooks (setup, finalize, keep_sessions) through every framework-free driver.

Real shell sessions, the real scripted chat server and the real openai client:
setup seeds a file, the model's tool calls see it, finalize reads the final
workspace before the sessions close.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from tests._chat import hermes

from toolservices import Episode, ToolEnv, UserError, shell_tools
from toolservices.shell import ShellService

pytest.importorskip("openai")
pytest.importorskip("uvicorn")

from toolservices.rollout import RetryPolicy, Rollout  # noqa: E402
from toolservices.rollout.testing import ScriptedChatServer  # noqa: E402

FAST = RetryPolicy(max_attempts=2, backoff=0.01, max_backoff=0.02)


async def seed(episode: Episode) -> None:
    """Async setup: write the row's text into the episode's workspace."""
    assert episode.shell is not None and episode.shell_session is not None
    await episode.shell.awrite_file(
        "seed.txt", episode.state["text"] + "\n", session_id=episode.shell_session
    )


def score(episode: Episode) -> dict[str, Any]:
    """Sync finalize (a worker thread: the sync service API works): read the final file."""
    assert episode.shell is not None and episode.shell_session is not None
    res = episode.shell.run(
        "cat seed.txt; test -f done.txt && echo DONE", session_id=episode.shell_session
    )
    return {"text": res.stdout, "reward": 1.0 if "DONE" in res.stdout else 0.0}


def bash(command: str) -> str:
    return hermes("bash", {"command": command})


async def test_rollout_seeds_scores_and_keeps_outcome(shell: ShellService) -> None:
    script = {
        "p0": [bash("cat seed.txt && touch done.txt"), "finished"],
        "p1": ["I give up"],
    }
    with ScriptedChatServer(script) as server:
        async with Rollout(
            shell_tools(shell),
            model="scripted",
            base_url=server.url,
            parser="hermes",
            retry=FAST,
            setup=seed,
            finalize=score,
        ) as runner:
            t0, t1 = await runner.arun(["p0", "p1"], states=[{"text": "alpha"}, {"text": "beta"}])
    assert t0.ok and t0.error is None, t0.error
    assert "alpha" in t0.messages[2]["content"]  # the model saw what setup seeded
    assert t0.outcome == {"text": "alpha\nDONE\n", "reward": 1.0}
    assert t1.outcome == {"text": "beta\n", "reward": 0.0}
    assert t0.shell_session is None  # closed: nothing kept


async def test_rollout_records_hook_errors_per_episode(shell: ShellService) -> None:
    def setup(episode: Episode) -> None:
        if episode.state["text"] == "bad":
            raise RuntimeError("no such repository")
        seed_sync(episode)

    def seed_sync(episode: Episode) -> None:
        assert episode.shell is not None and episode.shell_session is not None
        episode.shell.write_file(
            "seed.txt", episode.state["text"] + "\n", session_id=episode.shell_session
        )

    async def finalize(episode: Episode) -> float:
        if episode.state["text"] == "boom":
            raise ValueError("hidden tests crashed")
        return 0.5

    script = {p: ["done"] for p in ("a", "b", "c")}
    with ScriptedChatServer(script) as server:
        async with Rollout(
            shell_tools(shell),
            model="scripted",
            base_url=server.url,
            parser="hermes",
            retry=FAST,
            setup=setup,
            finalize=finalize,
        ) as runner:
            good, bad, boom = await runner.arun(
                ["a", "b", "c"], states=[{"text": "ok"}, {"text": "bad"}, {"text": "boom"}]
            )
    assert good.ok and good.outcome == 0.5 and good.error is None
    assert bad.finish_reason == "setup_error" and not bad.ok
    assert bad.error == "setup failed: RuntimeError: no such repository"
    assert bad.turns == [] and len(server.requests) == 2  # never asked the model
    assert bad.outcome is None  # finalize does not run after a failed setup
    assert boom.finish_reason == "answered" and boom.outcome is None
    assert boom.error == "finalize failed: ValueError: hidden tests crashed"
    # every session was closed all the same
    assert shell.stats()["sessions"] == 0


async def test_keep_sessions_leaves_the_workspace_to_the_caller(shell: ShellService) -> None:
    with ScriptedChatServer({"q": [bash("echo kept > out.txt"), "done"]}) as server:
        async with Rollout(
            shell_tools(shell),
            model="scripted",
            base_url=server.url,
            parser="hermes",
            retry=FAST,
            keep_sessions=True,
        ) as runner:
            (trajectory,) = await runner.arun(["q"])
    session = trajectory.shell_session
    assert session is not None
    try:
        assert (await shell.aread_file("out.txt", session_id=session)).strip() == "kept"
    finally:
        assert await shell.aclose_session(session)


def test_sync_with_episode_runs_setup_and_finalize(shell: ShellService) -> None:
    calls: list[str] = []

    def setup(episode: Episode) -> None:
        calls.append("setup")
        assert episode.shell is not None and episode.shell_session is not None
        episode.shell.write_file("x.txt", "1", session_id=episode.shell_session)

    def finalize(episode: Episode) -> str:
        calls.append("finalize")
        assert episode.shell is not None and episode.shell_session is not None
        return episode.shell.read_file("x.txt", session_id=episode.shell_session).strip()

    with Episode(shell_tools(shell), setup=setup, finalize=finalize) as episode:
        (message,) = episode.step(bash("cat x.txt"))
        assert message["content"].startswith("1")
    assert calls == ["setup", "finalize"]
    assert episode.outcome == "1" and episode.closed and episode.reason == "closed"
    session = episode.shell_session
    assert session is not None and not shell.close_session(session)  # already closed


def test_tool_env_runs_hooks_per_item(shell: ShellService) -> None:
    env = ToolEnv(shell_tools(shell), setup=seed, finalize=score, max_turns=30)
    try:
        env.reset(["a", "b"], states=[{"text": "one"}, {"text": "two"}])
        step = env.step([bash("touch done.txt"), "no tools"])
        assert step.done == [False, True]
        assert env.finalize() == [
            {"text": "one\nDONE\n", "reward": 1.0},
            {"text": "two\n", "reward": 0.0},
        ]
    finally:
        env.close()
    assert env.errors == [None, None]


def test_hooks_must_be_callable(shell: ShellService) -> None:
    with pytest.raises(UserError, match="setup must be a function"):
        Episode(shell_tools(shell), setup="seed.sh")  # type: ignore[arg-type]
    with pytest.raises(UserError, match="finalize must be a function"):
        ToolEnv(shell_tools(shell), finalize=3)  # type: ignore[arg-type]


def test_trainer_configs_name_hooks_by_import_path() -> None:
    from toolservices.trainers._calls import load_hook

    assert load_hook("setup", None) is None
    assert load_hook("setup", "json:dumps") is json.dumps
    assert load_hook("finalize", score) is score
    with pytest.raises(UserError, match="must be 'package.module:function'"):
        load_hook("setup", "json.dumps")
    with pytest.raises(UserError, match="cannot be loaded"):
        load_hook("finalize", "json:nope")
    with pytest.raises(UserError, match="is a str, not a function"):
        load_hook("setup", "os:sep")
