"""The Python executor pool as a shared service, on both backends."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from toolservices.python import PythonExecutorService
from toolservices.services import ServiceRegistry, get_services

pytestmark = pytest.mark.timeout(180)


def _options(backend: str) -> dict[str, Any]:
    return {"num_cpus": 0} if backend == "ray" else {}


def _in_other_worker(backend: str, namespace: str, code: str, session_id: str) -> dict[str, Any]:
    """Run ``code`` through a registry object of another worker (a Ray task, or a thread)."""
    if backend == "ray":
        import ray

        @ray.remote(num_cpus=0)
        def task() -> dict[str, Any]:
            client = get_services("ray", namespace=namespace).client("python")
            return dict(client.call("execute", code, session_id=session_id))

        return ray.get(task.remote(), timeout=60)
    out: dict[str, Any] = {}

    def run() -> None:
        client = get_services("local", namespace=namespace).client("python")
        out.update(client.call("execute", code, session_id=session_id))

    thread = threading.Thread(target=run)
    thread.start()
    thread.join(timeout=60)
    return out


def test_executor_session_affinity_across_workers(backend: str, registry: ServiceRegistry) -> None:
    registry.register("python", PythonExecutorService, 2, 10.0, **_options(backend))
    client = registry.client("python")
    assert client.call("execute", "x = 41", session_id="env-0")["success"]
    out = _in_other_worker(backend, registry.namespace, "print(x + 1)", "env-0")
    assert out["success"], out
    assert out["stdout"] == "42\n"
    other = client.call("execute", "print(x)", session_id="env-1")
    assert not other["success"]
    assert "NameError" in other["stderr"]
    failing = client.call("execute", "raise ValueError('Test error')", session_id="env-0")
    assert not failing["success"] and "ValueError: Test error" in failing["stderr"]


async def test_executor_async_client(backend: str, registry: ServiceRegistry) -> None:
    registry.register("python", PythonExecutorService, 1, 10.0, **_options(backend))
    client = registry.client("python")
    await client.acall("execute", "y = 'kept'", session_id="s")
    out = await client.acall("execute", "print(y)", session_id="s")
    assert out["stdout"] == "kept\n"
    client.call("close_session", session_id="s")
    after = await client.acall("execute", "print(y)", session_id="s")
    assert not after["success"]


def test_executor_replicas_keep_sessions(backend: str, registry: ServiceRegistry) -> None:
    opts = {"num_replicas": 2, **_options(backend)}
    registry.register("python", PythonExecutorService, pool_size=1, **opts)
    client = registry.client("python")
    sessions = [f"env-{i}" for i in range(6)]
    assert {client.replica_for(s) for s in sessions} == {0, 1}  # spread over both
    for i, session in enumerate(sessions):
        assert client.call("execute", f"v = {i}", session_id=session)["success"]
    for i, session in enumerate(sessions):
        out = client.call("execute", "print(v)", session_id=session)
        assert out["stdout"] == f"{i}\n", (session, out)
    # Another worker reaches the same interpreters.
    out = _in_other_worker(backend, registry.namespace, "print(v * 10)", sessions[3])
    assert out["stdout"] == "30\n"
    # Calls without a session are balanced and stateless.
    results = [client.call("execute", "print('hi')") for _ in range(4)]
    assert all(r["stdout"] == "hi\n" for r in results)


def test_get_or_register_executor(backend: str, namespace: str) -> None:
    first = get_services(backend, namespace=namespace)
    second = get_services(backend, namespace=namespace)
    try:
        first.get_or_register("python", PythonExecutorService, pool_size=1, **_options(backend))
        second.get_or_register("python", PythonExecutorService, pool_size=1, **_options(backend))
        assert first.list() == ["python"]
        out = second.client("python").call("execute", "print(2 + 2)", session_id="a")
        assert out["stdout"] == "4\n"
    finally:
        first.shutdown()
    assert second.list() == []


@pytest.mark.ray
@pytest.mark.parametrize("how", ["reset", "actor killed"])
def test_no_interpreter_outlives_its_ray_actor(
    ray_started: dict[str, Any], namespace: str, how: str
) -> None:
    import os

    import psutil
    import ray

    registry = get_services("ray", namespace=namespace)
    try:
        handle = registry.register("python", PythonExecutorService, pool_size=1, num_cpus=0)
        assert registry.client("python").call("execute", "print(1)", session_id="s")["success"]
        actor_pid = ray.get(handle.__ray_call__.remote(lambda self: os.getpid()))
        actor = psutil.Process(actor_pid)
        processes = [actor, *actor.children(recursive=True)]
        assert len(processes) > 1  # the interpreter(s)
        if how == "reset":
            registry.reset()
        else:
            ray.kill(handle, no_restart=True)
        _, alive = psutil.wait_procs(processes, timeout=30)
        assert alive == []
    finally:
        registry.reset()


@pytest.mark.ray
def test_raw_handle_calls_overlap(ray_started: dict[str, Any], namespace: str) -> None:
    """TorchRL users call ``ray.get(handle.execute.remote(code))``: those calls
    must not queue behind each other on the actor's event loop."""
    import ray

    registry = get_services("ray", namespace=namespace)
    try:
        handle = registry.register("python", PythonExecutorService, pool_size=2, num_cpus=0)
        warm = [handle.execute.remote("print(0)", session_id=s) for s in ("a", "b")]
        assert all(r["success"] for r in ray.get(warm, timeout=60))
        # Each call reports when it started and ended (host clock). Queued one
        # behind the other the spans are disjoint whatever the load; the 1.5 s
        # sleep is only slack for the two calls starting at slightly different times.
        code = "import time\nstarted = time.time()\ntime.sleep(1.5)\nprint(started, time.time())"
        refs = [handle.execute.remote(code, session_id=s) for s in ("a", "b")]
        results = ray.get(refs, timeout=60)
        (a_start, a_end), (b_start, b_end) = (map(float, r["stdout"].split()) for r in results)
        # The two calls overlapped in time: neither waited for the other to finish.
        assert a_start < b_end and b_start < a_end
    finally:
        registry.reset()


async def test_executor_reports_a_session_its_client_used_before_as_restarted() -> None:
    """The hint a Ray client sends for sessions it used: unknown here means state lost."""
    with PythonExecutorService(pool_size=2, spares=0) as executor:
        lost = executor.execute("print(1)", session_id="a", _session_known=True)
        assert lost.restarted and lost.stdout == "1\n"
        held = executor.execute("x = 2", session_id="a", _session_known=True)
        assert not held.restarted
        moved = await executor.aexecute("print(3)", session_id="b", _session_known=True)
        assert moved.restarted and moved.stdout == "3\n"
        new = await executor.aexecute("print(x)", session_id="a")
        assert not new.restarted and new.stdout == "2\n"
        assert executor.stats()["restarts"] == 2
