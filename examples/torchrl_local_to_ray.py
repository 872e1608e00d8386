"""From a local service registry to Ray: the same episode, one word changed.

Run:  .venv/bin/python examples/torchrl_local_to_ray.py               (in-process, seconds)
      .venv/bin/python examples/torchrl_local_to_ray.py --backend ray  (starts a local Ray)

The Python executor is registered once under a name; any number of
environments (here two, as if in two collector workers) use it through
``PythonInterpreter(services=...)``. Each environment's batch items get their
own sessions, so variables never leak between items or environments, and a
partial reset (a ``_reset`` mask) ends only the reset items' sessions.
Moving to Ray changes only the backend name: ``get_services("ray")`` makes the
executor a named Ray actor that workers on other machines find by name.
"""

from __future__ import annotations

import argparse

import torch
from tensordict import TensorDict, lazy_stack
from torchrl.data.llm import History
from torchrl.envs import TransformedEnv
from torchrl.envs.llm import ChatEnv

from toolservices import get_services
from toolservices.torchrl import PythonExecutorService, PythonInterpreter

NAMESPACE = "local-to-ray-example"


def step(env: TransformedEnv, td: TensorDict, texts: list[str]) -> TensorDict:
    history = td["history"]
    response = lazy_stack([History(role="assistant", content=t).unsqueeze(0) for t in texts])
    history.full = history.prompt.extend(response, inplace=False, dim=-1)
    history.response = response
    td["history"] = history
    return env.step(td)["next"].exclude("done", "terminated")


def last_tool_text(td: TensorDict) -> list[str]:
    return [str(c) for c in td["history"].prompt[..., -1].content]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--backend", choices=("local", "ray"), default="local")
    backend = parser.parse_args().backend

    init = {"ray_init_config": {"num_cpus": 2, "include_dashboard": False}}
    services = get_services(backend, namespace=NAMESPACE, **(init if backend == "ray" else {}))
    services.get_or_register("python_executor", PythonExecutorService, pool_size=4)
    client = services.client("python_executor")

    envs = [
        TransformedEnv(
            ChatEnv(batch_size=(2,)), PythonInterpreter(services=backend, namespace=NAMESPACE)
        )
        for _ in range(2)
    ]
    try:
        tds = [env.reset(TensorDict(query=["count", "count"], batch_size=(2,))) for env in envs]
        code = "```python\n{}\n```"
        for e, (env, td) in enumerate(zip(envs, tds, strict=True)):
            tds[e] = step(env, td, [code.format(f"n = {10 * e + i}") for i in range(2)])
        for e, (env, td) in enumerate(zip(envs, tds, strict=True)):
            tds[e] = step(env, td, [code.format("n += 1\nprint(n)")] * 2)
            print(f"env {e}:", [t.split("\n")[1] for t in last_tool_text(tds[e])])
        print("sessions on the shared executor:", client.call("stats")["sessions"])

        # env 0 resets item 1 only: its session ends, the others keep their state
        envs[0].reset(
            TensorDict(
                {"_reset": torch.tensor([[False], [True]]), "query": ["count", "count"]},
                batch_size=(2,),
            )
        )
        print("after a partial reset of env 0, item 1:", client.call("stats")["sessions"])
    finally:
        for env in envs:
            env.close()
        print("after closing the environments:", client.call("stats")["sessions"])
        services.reset()


if __name__ == "__main__":
    main()
