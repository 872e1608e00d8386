"""A SWE-style coding-agent rollout: seed a buggy repository, let the model fix it, score it.

Run: .venv/bin/python examples/swe_rollout.py

No model is downloaded: a scripted OpenAI-compatible server on 127.0.0.1
(``toolservices.rollout.testing.ScriptedChatServer``) plays the model, with
the real ``openai`` client and the real sandboxed shell. Per episode:

* ``setup`` seeds the episode's shell session with a small repository whose
  ``add`` has a bug, and commits it (git has an identity in the sandbox);
* the model runs the visible tests, reads the file, fixes it with
  ``str_replace`` and runs the tests again (all through the shell tools);
* ``finalize`` runs hidden tests on the final workspace, outside the
  repository, and returns the reward, which is the trajectory's ``outcome``.

Two prompts: one model fixes the bug (reward 1.0), one gives up (reward 0.0).
"""

from __future__ import annotations

import json
from typing import Any

from toolservices import Episode, shell_tools
from toolservices.rollout import Rollout
from toolservices.rollout.testing import ScriptedChatServer
from toolservices.shell import ShellService

REPOSITORY = {
    "tests/__init__.py": "",
    "calc/__init__.py": '"""A tiny calculator."""\n\n\ndef add(a, b):\n    return a - b\n',
    "tests/test_calc.py": (
        "import unittest\n\nfrom calc import add\n\n\n"
        "class AddTest(unittest.TestCase):\n"
        "    def test_small(self):\n        self.assertEqual(add(2, 2), 4)\n"
    ),
}
#: Tests the model never sees: written outside the workspace by finalize.
HIDDEN_TESTS = (
    "import unittest\n\nfrom calc import add\n\n\n"
    "class Hidden(unittest.TestCase):\n"
    "    def test_negative(self):\n        self.assertEqual(add(-3, 5), 2)\n\n"
    "    def test_floats(self):\n        self.assertAlmostEqual(add(0.1, 0.2), 0.3)\n"
)
RUN_TESTS = "python3 -m unittest discover -s tests -t . 2>&1 | tail -3"
TASK = "The tests of calc fail. Find the bug and fix it."


async def seed_repository(episode: Episode) -> None:
    """setup: the repository, committed, in the episode's own shell session."""
    shell, session = episode.shell, episode.shell_session
    assert shell is not None and session is not None
    for path, text in REPOSITORY.items():
        await shell.awrite_file(path, text, session_id=session)
    res = await shell.arun("git init -q && git add -A && git commit -qm seed", session_id=session)
    if res.returncode != 0:
        raise RuntimeError(f"cannot seed the repository: {res.stderr}")


async def hidden_tests(episode: Episode) -> dict[str, Any]:
    """finalize: run the hidden tests on the final workspace; the reward and the diff."""
    shell, session = episode.shell, episode.shell_session
    assert shell is not None and session is not None
    await shell.awrite_file("/tmp/hidden/test_hidden.py", HIDDEN_TESTS, session_id=session)
    res = await shell.arun(
        "PYTHONPATH=$PWD python3 -m unittest discover -s /tmp/hidden 2>&1 | tail -1",
        session_id=session,
    )
    diff = await shell.arun("git diff --stat | tail -1", session_id=session)
    return {
        "reward": 1.0 if res.stdout.strip() == "OK" else 0.0,
        "diff": diff.stdout.strip(),
    }


def call(call_id: str, name: str, args: dict[str, Any]) -> dict[str, Any]:
    """One tool call as a server with a tool parser returns it."""
    return {
        "id": call_id,
        "type": "function",
        "function": {"name": name, "arguments": json.dumps(args)},
    }


def fixing_model() -> list[dict[str, Any] | str]:
    """The scripted turns of a model that fixes the bug."""
    return [
        {
            "content": "Let me run the tests.",
            "tool_calls": [call("c1", "bash", {"command": RUN_TESTS})],
        },
        {"tool_calls": [call("c2", "read_file", {"path": "calc/__init__.py"})]},
        {
            "content": "add subtracts: fixing it.",
            "tool_calls": [
                call(
                    "c3",
                    "str_replace",
                    {
                        "path": "calc/__init__.py",
                        "old_str": "return a - b",
                        "new_str": "return a + b",
                    },
                )
            ],
        },
        {"tool_calls": [call("c4", "bash", {"command": RUN_TESTS})]},
        "Fixed: add returned a - b; it now returns a + b and the tests pass.",
    ]


def main() -> None:
    script = {TASK: fixing_model(), f"{TASK} (second try)": ["I cannot find the bug."]}
    with ShellService(pool_size=2, timeout=30.0) as shell, ScriptedChatServer(script) as server:
        runner = Rollout(
            shell_tools(shell),
            model="scripted",
            base_url=server.url,
            max_turns=30,  # a coding agent reads, edits and tests: more than the default 8
            setup=seed_repository,
            finalize=hidden_tests,
        )
        with runner:
            trajectories = runner.run([TASK, f"{TASK} (second try)"])
    for trajectory in trajectories:
        assert trajectory.ok, trajectory.error
        outcome = trajectory.outcome
        print(
            f"episode {trajectory.index}: {trajectory.finish_reason} after {len(trajectory.turns)} "
            f"turns, {trajectory.metrics.calls} tool calls; reward {outcome['reward']} "
            f"({outcome['diff'] or 'no change'})"
        )
    tool_outputs = [m["content"] for m in trajectories[0].messages if m["role"] == "tool"]
    print("first test run the model saw:", tool_outputs[0].splitlines()[-1])
    print("last test run the model saw:", tool_outputs[-1].splitlines()[-1])
    assert [t.outcome["reward"] for t in trajectories] == [1.0, 0.0]


if __name__ == "__main__":
    main()
