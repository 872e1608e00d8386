"""``ServiceExecutor``: episodes whose Python runs in a registered executor service."""

from __future__ import annotations

import json
from typing import Any

import pytest

from toolservices.env import Episode, python_tool
from toolservices.errors import UserError
from toolservices.services import ServiceExecutor, ServiceRegistry

python = pytest.importorskip("toolservices.python")
PythonExecutorService = python.PythonExecutorService

pytestmark = pytest.mark.timeout(180)


def _options(backend: str) -> dict[str, Any]:
    return {"num_cpus": 0} if backend == "ray" else {}


def _call(code: str) -> str:
    return (
        f"<tool_call>\n{json.dumps({'name': 'python', 'arguments': {'code': code}})}\n</tool_call>"
    )


async def test_episodes_keep_their_state_through_the_service(
    backend: str, registry: ServiceRegistry
) -> None:
    registry.register(
        "python", PythonExecutorService, pool_size=1, num_replicas=2, **_options(backend)
    )
    executor = ServiceExecutor(registry.client("python", timeout=60.0), timeout=10.0)
    run = python_tool(executor)
    assert run.timeout == 15.0  # the executor's limit plus python_tool's grace
    async with Episode([run], python=executor) as a, Episode([run], python=executor) as b:
        await a.astep(_call("x = 41"))
        other = await b.astep(_call("print('x' in globals())"))
        assert other[0]["content"] == "False\n"
        mine = await a.astep(_call("print(x + 1)"))
        assert mine[0]["content"] == "42\n"
        session = a.python_session
        with pytest.raises(UserError, match="2 replicas"):
            await a.afork(2)
    assert session is not None
    gone = executor.execute("print('x' in globals())", session_id=session)
    assert gone["stdout"] == "False\n"  # closing the episode ended its session


async def test_fork_through_a_single_replica_service(
    backend: str, registry: ServiceRegistry
) -> None:
    registry.register("python", PythonExecutorService, pool_size=1, **_options(backend))
    executor = ServiceExecutor(registry.client("python", timeout=60.0))
    async with Episode([python_tool(executor)], python=executor) as prefix:
        await prefix.astep(_call("data = [3, 1, 2]"))
        (copy,) = await prefix.afork(1)
        await copy.astep(_call("data.sort()"))
        assert (await copy.astep(_call("print(data)")))[0]["content"] == "[1, 2, 3]\n"
        assert (await prefix.astep(_call("print(data)")))[0]["content"] == "[3, 1, 2]\n"
        await copy.aclose()
