"""The SWE-style examples run as a user runs them (issue #23, section 7).

``examples/swe_rollout.py``: a Rollout against the scripted OpenAI-compatible
server, setup seeding a buggy repository, the scripted model fixing it with
the shell tools, finalize scoring it with hidden tests. ``examples/swe_trl.py``:
the same task through TRL's ``environment_factory`` adapter.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).parents[2] / "examples"


def run(name: str) -> str:
    env = dict(os.environ)
    src = str(Path(__file__).parents[2] / "src")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (src, env.get("PYTHONPATH")) if p)
    proc = subprocess.run(
        [sys.executable, str(EXAMPLES / name)],
        capture_output=True,
        text=True,
        timeout=100,
        check=False,
        env=env,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    return proc.stdout


@pytest.mark.timeout(120)
def test_swe_rollout_example_fixes_the_bug_and_scores_it() -> None:
    pytest.importorskip("openai")
    pytest.importorskip("uvicorn")
    out = run("swe_rollout.py")
    assert "episode 0: answered after 5 turns, 4 tool calls; reward 1.0" in out
    assert "episode 1: answered after 1 turns, 0 tool calls; reward 0.0 (no change)" in out
    assert "first test run the model saw: FAILED (failures=1)" in out
    assert "last test run the model saw: OK" in out


@pytest.mark.timeout(120)
def test_swe_trl_example_rewards_through_the_adapter() -> None:
    out = run("swe_trl.py")
    assert "tests before: FAILED (failures=1)\n" in out and "tests after: OK\n" in out
    assert out.endswith("rewards: fixed 1.0, untouched 0.0\n")
