"""The SWE-style task of ``swe_rollout.py`` through TRL's adapter (``environment_factory``).

Run: .venv/bin/python examples/swe_trl.py

``trl_environment(shell_tools(shell), setup=..., finalize=...)`` is the class
to pass as ``GRPOTrainer(environment_factory=...)``. TRL calls
``reset(**row)`` per rollout (the row becomes the episode's ``state`` and
``setup`` seeds the repository), the tool methods as the model calls them,
and ``get_reward()`` at the end (``finalize`` runs the hidden tests; its
value is the reward). Here the calls a trainer would make are made by hand,
so the example needs neither TRL nor a model.
"""

from __future__ import annotations

from typing import Any

from swe_rollout import RUN_TESTS, hidden_tests, seed_repository

from toolservices import Episode, shell_tools
from toolservices.shell import ShellService
from toolservices.trainers.trl import trl_environment


async def reward(episode: Episode) -> float:
    """finalize for TRL: the hidden tests' reward (a float: TRL sums rewards)."""
    outcome: dict[str, Any] = await hidden_tests(episode)
    return float(outcome["reward"])


def main() -> None:
    with ShellService(pool_size=2, timeout=30.0) as shell:
        Env = trl_environment(shell_tools(shell), setup=seed_repository, finalize=reward)
        env: Any = Env()
        try:
            env.reset(task="fix calc", difficulty="easy")  # a dataset row
            print("tests before:", env.bash(command=RUN_TESTS).splitlines()[-1])
            print(
                env.str_replace(
                    path="calc/__init__.py", old_str="return a - b", new_str="return a + b"
                ).splitlines()[0]
            )
            print("tests after:", env.bash(command=RUN_TESTS).splitlines()[-1])
            fixed = env.get_reward()
            env.reset(task="fix calc", difficulty="easy")  # the next rollout: a fresh repository
            untouched = env.get_reward()
        finally:
            Env.close_all()
    print(f"rewards: fixed {fixed}, untouched {untouched}")
    assert (fixed, untouched) == (1.0, 0.0)


if __name__ == "__main__":
    main()
