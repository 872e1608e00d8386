"""A math episode in a TorchRL ChatEnv whose Python runs in the shared executor.

Run: .venv/bin/python examples/torchrl_math_python.py

No model is downloaded: the assistant turns are scripted. Two problems run as
one batch; each item's variables survive between turns because the
``PythonInterpreter`` keeps one executor session per batch item. The executor
is registered once in the (in-process) service registry and could be shared
by many environments.
"""

from __future__ import annotations

from tensordict import TensorDict, lazy_stack
from torchrl.data.llm import History
from torchrl.envs import TransformedEnv
from torchrl.envs.llm import ChatEnv

from toolservices import get_services
from toolservices.torchrl import METRICS_KEY, PythonExecutorService, PythonInterpreter

SCRIPT = [
    [
        "Let me set up the numbers.\n```python\nprices = [12.5, 7.25, 30]\nprint(sum(prices))\n```",
        "```python\nimport math\nr = 3\narea = math.pi * r ** 2\nprint(round(area, 3))\n```",
    ],
    [
        "Now with 20% tax.\n```python\ntotal = sum(prices) * 1.2\nprint(round(total, 2))\n```",
        "And the circumference:\n```python\nprint(round(2 * math.pi * r, 3))\n```",
    ],
    ["The total with tax is \\boxed{59.7}.", "The area is \\boxed{28.274}."],
]


def main() -> None:
    services = get_services("local", namespace="math-example")
    services.get_or_register("python_executor", PythonExecutorService, pool_size=4)
    env = TransformedEnv(
        ChatEnv(batch_size=(2,), system_prompt="Solve the problem. Use Python when useful."),
        PythonInterpreter(services="local", namespace="math-example", max_failed_turns=2),
    )
    td = env.reset(
        TensorDict(
            query=["What do 12.5, 7.25 and 30 cost with 20% tax?", "Area of a circle, r=3?"],
            batch_size=(2,),
        )
    )
    try:
        for turn, texts in enumerate(SCRIPT, start=1):
            history = td["history"]
            response = lazy_stack(
                [History(role="assistant", content=t).unsqueeze(0) for t in texts]
            )
            history.full = history.prompt.extend(response, inplace=False, dim=-1)
            history.response = response
            td["history"] = history
            out = env.step(td)["next"]
            print(f"turn {turn}: tool calls per item {out[METRICS_KEY, 'calls'].tolist()}")
            td = out.exclude("done", "terminated")
        for i, conversation in enumerate(td["history"].prompt.tolist()):
            print(f"\n=== item {i} ===")
            for message in conversation:
                if message["role"] != "<none>":
                    print(f"[{message['role']}] {message['content']}")
    finally:
        env.close()
        services.reset()


if __name__ == "__main__":
    main()
