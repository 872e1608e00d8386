"""PythonInterpreter(services="ray"): per-item sessions on a Ray actor executor."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from toolservices import get_services
from toolservices.torchrl import PythonExecutorService, PythonInterpreter

pytestmark = pytest.mark.ray

RAY_INIT_CONFIG: dict[str, Any] = {
    "num_cpus": 2,
    "include_dashboard": False,
    "log_to_driver": False,
    "object_store_memory": 80 * 1024 * 1024,
}


@pytest.fixture(scope="module")
def ray_namespace() -> Iterator[str]:
    ray = pytest.importorskip("ray")
    was_running = ray.is_initialized()
    namespace = f"torchrl-{uuid.uuid4().hex[:8]}"
    registry = get_services("ray", namespace=namespace, ray_init_config=RAY_INIT_CONFIG)
    registry.register("python_executor", PythonExecutorService, pool_size=4, max_concurrency=16)
    try:
        yield namespace
    finally:
        registry.reset()
        if not was_running:
            ray.shutdown()


def block(code: str) -> str:
    return f"```python\n{code}\n```"


def test_ray_service_keeps_each_items_variables(chat: Any, ray_namespace: str) -> None:
    transform = PythonInterpreter(services="ray", namespace=ray_namespace)
    assert transform.python_service is not None and transform.processes is None
    client = get_services("ray", namespace=ray_namespace).client("python_executor")
    driver = chat(transform, 3)
    driver.step([block(f"x = {i}") for i in range(3)])
    driver.step([block("x *= 10"), "thinking", block("x *= 100")])
    driver.step([block("print(x)")] * 3)
    outputs = [driver.tool_texts(i)[0] for i in range(3)]
    assert outputs == [f"Code block 1 executed successfully:\n{v}\n" for v in (0, 1, 200)]
    assert client.call("stats")["sessions"] == 3
    driver.reset_items([False, True, False])
    assert client.call("stats")["sessions"] == 2
    driver.step([block("print(x)")] * 3)
    assert "NameError" in driver.tool_texts(1)[0]
    assert driver.tool_texts(2) == ["Code block 1 executed successfully:\n200\n"]
    transform.close()
    assert client.call("stats")["sessions"] == 0
