"""``env.step`` of a ChatEnv with tool transforms: ours vs TorchRL 0.14.1's, same run.

Run: .venv/bin/python benchmarks/bench_torchrl.py [--quick]

For batches of 8 and 32, each item's assistant message makes one call:

* ``blocking 0.2 s``: ``ExecuteToolsInOrder`` with a tool that sleeps 0.2 s
  in plain blocking code (``time.sleep``);
* ``python 0.3 s``: ``PythonInterpreter(persistent=True)`` running
  ``time.sleep(0.3)`` in each item's interpreter (warm: interpreters exist);
* ``no-op``: ``ExecuteToolsInOrder`` with a tool that returns at once;
* with ``--ray``, also ``python 0.3 s via Ray``: ``PythonInterpreter(services="ray")``
  with each library's executor registered as a Ray actor (a local Ray is
  started; this adds its start-up time to the run, not to the medians).

Only ``env.step`` is timed; the step input (a fresh history with the
assistant turn) is built before each timed call. Medians over the repeats;
the ratio is TorchRL's median divided by ours (higher is better for us).
"""

from __future__ import annotations

import argparse
import logging
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
from _util import fmt_time  # noqa: E402
from tensordict import TensorDict, TensorDictBase, lazy_stack  # noqa: E402
from torchrl.data.llm import History  # noqa: E402
from torchrl.envs import TransformedEnv  # noqa: E402
from torchrl.envs.llm import ChatEnv  # noqa: E402
from torchrl.envs.llm import transforms as trl  # noqa: E402
from torchrl.modules.llm.policies import ChatHistory  # noqa: E402

import toolservices.torchrl as ours  # noqa: E402


class Sleep:
    """A TorchRL-style service that blocks for ``seconds``."""

    name = "sleep"
    schema_in = {"seconds": float}
    schema_out = {"slept": float}

    def __call__(self, seconds: float, **kwargs: Any) -> dict[str, float]:
        time.sleep(seconds)
        return {"slept": seconds}


class Noop:
    """A TorchRL-style service that returns at once."""

    name = "noop"
    schema_in = {"x": int}
    schema_out = {"x": int}

    def __call__(self, x: int, **kwargs: Any) -> dict[str, int]:
        return {"x": x}


def step_input(batch: int, text: str) -> TensorDictBase:
    """What a policy hands to ``env.step``: prompt, response and full history."""
    prompt = History.from_chats([[{"role": "user", "content": f"q{i}"}] for i in range(batch)])
    response = lazy_stack([History(role="assistant", content=text).unsqueeze(0)] * batch)
    history = ChatHistory(
        prompt=prompt, response=response, full=prompt.extend(response, inplace=False, dim=-1)
    )
    return TensorDict(history=history, batch_size=(batch,))


def time_steps(env: TransformedEnv, batch: int, text: str, *, repeats: int, warmup: int) -> float:
    samples = []
    for k in range(warmup + repeats):
        td = step_input(batch, text)
        started = time.perf_counter()
        out = env.step(td)
        elapsed = time.perf_counter() - started
        if k >= warmup:
            samples.append(elapsed)
    last = out["next", "history"].prompt[..., -1].content
    assert all("fail" not in str(c) for c in last), last
    return statistics.median(samples)


def scenario(
    name: str,
    batch: int,
    text: str,
    make_ours: Callable[[], Any],
    make_theirs: Callable[[], Any],
    *,
    repeats: tuple[int, int],
    warmup: int = 1,
) -> dict[str, Any]:
    row: dict[str, Any] = {"scenario": name, "batch": batch}
    for label, make, n in (("ours", make_ours, repeats[0]), ("torchrl", make_theirs, repeats[1])):
        transform = make()
        env = TransformedEnv(ChatEnv(batch_size=(batch,)), transform)
        try:
            row[label] = time_steps(env, batch, text, repeats=n, warmup=warmup)
        finally:
            transform.close()
    row["ratio"] = row["torchrl"] / row["ours"]
    print(
        f"{name:<16} batch {batch:>2}: ours {fmt_time(row['ours']):>10}  "
        f"TorchRL {fmt_time(row['torchrl']):>10}  ratio {row['ratio']:6.1f}x",
        flush=True,
    )
    return row


def ray_rows(repeats: tuple[int, int]) -> list[dict[str, Any]]:
    """``PythonInterpreter(services="ray")`` of both libraries on one local Ray."""
    import uuid

    from torchrl.services import get_services as torchrl_services

    from toolservices import get_services

    namespace = f"bench-{uuid.uuid4().hex[:6]}"
    init = {"num_cpus": 4, "include_dashboard": False, "log_to_driver": False}
    our_registry = get_services("ray", namespace=namespace, ray_init_config=init)
    our_registry.register(
        "python_executor", ours.PythonExecutorService, pool_size=32, max_concurrency=64
    )
    their_registry = torchrl_services("ray", namespace=namespace + "-torchrl")
    their_registry.register(
        "python_executor", trl.PythonExecutorService, pool_size=32, max_concurrency=32
    )
    rows = []
    try:
        for batch in (8, 32):
            rows.append(
                scenario(
                    "python 0.3 s via Ray",
                    batch,
                    "```python\nimport time\ntime.sleep(0.3)\nprint('done')\n```",
                    lambda: ours.PythonInterpreter(services="ray", namespace=namespace),
                    lambda: trl.PythonInterpreter(services="ray", namespace=namespace + "-torchrl"),
                    repeats=repeats,
                )
            )
    finally:
        our_registry.reset()
        their_registry.reset()
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="fewer repeats (a smoke run)")
    parser.add_argument("--ray", action="store_true", help="add the Ray-service scenario")
    parser.add_argument(
        "--only",
        choices=("blocking", "python", "noop", "ray"),
        action="append",
        help="run only these scenarios (repeatable; default: all)",
    )
    args = parser.parse_args()
    wanted = set(args.only or ("blocking", "python", "noop"))
    if args.ray:
        wanted.add("ray")
    logging.getLogger("torchrl").setLevel(logging.WARNING)  # it logs every code line at INFO
    slow = (3, 2) if args.quick else (7, 3)
    fast = (30, 30) if args.quick else (200, 200)

    rows = []
    for batch in (8, 32) if "blocking" in wanted else ():
        rows.append(
            scenario(
                "blocking 0.2 s",
                batch,
                '<tool name="sleep">{"seconds": 0.2}</tool>',
                lambda: ours.ExecuteToolsInOrder(
                    ours.ToolRegistry([Sleep()]), ours.XMLBlockParser()
                ),
                lambda: trl.ExecuteToolsInOrder(trl.ToolRegistry([Sleep()]), trl.XMLBlockParser()),
                repeats=slow,
            )
        )
    for batch in (8, 32) if "python" in wanted else ():
        rows.append(
            scenario(
                "python 0.3 s",
                batch,
                "```python\nimport time\ntime.sleep(0.3)\nprint('done')\n```",
                lambda: ours.PythonInterpreter(persistent=True),
                lambda: trl.PythonInterpreter(persistent=True),
                repeats=slow,
            )
        )
    for batch in (8, 32) if "noop" in wanted else ():
        rows.append(
            scenario(
                "no-op",
                batch,
                '<tool name="noop">{"x": 1}</tool>',
                lambda: ours.ExecuteToolsInOrder(
                    ours.ToolRegistry([Noop()]), ours.XMLBlockParser()
                ),
                lambda: trl.ExecuteToolsInOrder(trl.ToolRegistry([Noop()]), trl.XMLBlockParser()),
                repeats=fast,
                warmup=5,
            )
        )

    if "ray" in wanted:
        rows.extend(ray_rows(slow))

    print("\n| scenario | batch | ours (median) | TorchRL 0.14.1 (median) | TorchRL / ours |")
    print("| --- | --- | --- | --- | --- |")
    for r in rows:
        print(
            f"| {r['scenario']} | {r['batch']} | {fmt_time(r['ours'])} | "
            f"{fmt_time(r['torchrl'])} | {r['ratio']:.1f}x |"
        )
    for r in rows:
        if r["batch"] != 8:
            continue
        if r["scenario"].startswith("blocking"):
            verdict = "met" if r["ours"] < 0.3 else "MISSED"
            print(f"\ntarget: blocking batch 8 < 0.3 s: {fmt_time(r['ours'])} ({verdict})")
        if r["scenario"] == "no-op":
            verdict = "met" if r["ours"] <= r["torchrl"] else "MISSED"
            print(
                f"target: no-op batch 8 no slower than TorchRL: {fmt_time(r['ours'])} vs "
                f"{fmt_time(r['torchrl'])} ({verdict})"
            )


if __name__ == "__main__":
    main()
