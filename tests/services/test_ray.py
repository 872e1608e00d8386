"""Ray-only behaviour: other workers, the registration race, actor death, options."""

from __future__ import annotations

import os
import pickle
import time
from collections.abc import Iterator
from typing import Any

import psutil
import pytest
from svc_helpers import (
    RAY_INIT_CONFIG,
    RAY_INIT_CONFIG_COPY,
    Counter,
    Sessions,
    WithMemoryParam,
    new_namespace,
)

from toolservices.errors import ServiceTimeoutError, ServiceUnavailableError, UserError
from toolservices.python import PythonExecutorService
from toolservices.services import ServiceRegistry, get_services

ray = pytest.importorskip("ray")

pytestmark = [pytest.mark.ray, pytest.mark.timeout(120)]


@pytest.fixture
def services(ray_started: dict[str, Any]) -> Iterator[ServiceRegistry]:
    registry = get_services("ray", namespace=new_namespace())
    try:
        yield registry
    finally:
        registry.reset()


def _actors_of(namespace: str) -> list[str]:
    return sorted(
        a["name"]
        for a in ray.util.list_named_actors(all_namespaces=True)
        if a["namespace"] == namespace
    )


def _kill(handle: Any, *, restart: bool = False) -> None:
    """ray.kill, then wait until the actor's process is really gone (kill is asynchronous)."""
    pid = ray.get(handle.pid.remote())
    ray.kill(handle, no_restart=not restart)
    try:
        psutil.Process(pid).wait(timeout=30)
    except psutil.NoSuchProcess:
        pass  # already reaped


# -- "other workers" are Ray tasks ---------------------------------------------------------


@ray.remote(num_cpus=0)
def _register_in_worker(namespace: str, name: str, num_replicas: int = 1) -> str:
    registry = get_services("ray", namespace=namespace)
    try:
        registry.register(name, Counter, 7, num_replicas=num_replicas)
    except ValueError as exc:
        return f"error: {exc}"
    return "created"


@ray.remote(num_cpus=0)
def _get_or_register_in_worker(namespace: str, name: str, num_replicas: int = 1) -> str:
    registry = get_services("ray", namespace=namespace)
    handle = registry.get_or_register(name, Counter, num_replicas=num_replicas, num_cpus=0)
    return handle._actor_id.hex()


@ray.remote(num_cpus=0)
def _call_in_worker(namespace: str, name: str, method: str, *args: Any, **kwargs: Any) -> Any:
    return get_services("ray", namespace=namespace).client(name).call(method, *args, **kwargs)


@ray.remote(num_cpus=0)
def _list_in_worker(namespace: str) -> list[str]:
    return get_services("ray", namespace=namespace).list()


@ray.remote(num_cpus=0)
def _use_shipped(registry: ServiceRegistry, client: Any, session_id: str) -> tuple[list[str], Any]:
    return registry.list(), client.call("remember", "worker", session_id=session_id)


def test_registry_and_client_can_be_shipped_to_workers(services: ServiceRegistry) -> None:
    """A transform holding a client is pickled into collector workers."""
    services.register("sess", Sessions, num_replicas=2, num_cpus=0)
    client = services.client("sess")
    client.call("remember", "driver", session_id="s7")
    names, out = ray.get(_use_shipped.remote(services, client, "s7"))
    assert names == ["sess"]
    assert out["seen"] == ["driver", "worker"]
    copy = pickle.loads(pickle.dumps(client))
    assert copy.call("remember", "copy", session_id="s7")["seen"] == ["driver", "worker", "copy"]


def test_ray_init_config_used_once_and_not_mutated(ray_started: dict[str, Any]) -> None:
    if not ray_started["was_running"]:
        assert ray.is_initialized()
    assert RAY_INIT_CONFIG == RAY_INIT_CONFIG_COPY
    bogus = {"num_cpus": -1, "not_an_option": True}
    get_services("ray", namespace=new_namespace(), ray_init_config=bogus)  # Ray runs: ignored
    assert bogus == {"num_cpus": -1, "not_an_option": True}


def test_service_registered_by_worker_is_visible_to_driver(services: ServiceRegistry) -> None:
    assert ray.get(_register_in_worker.remote(services.namespace, "from-worker")) == "created"
    assert services.list() == ["from-worker"]
    assert services.client("from-worker").call("incr") == 8


def test_service_registered_by_driver_is_visible_to_workers(services: ServiceRegistry) -> None:
    services.register("from-driver", Counter, 1)
    ns = services.namespace
    assert ray.get(_list_in_worker.remote(ns)) == ["from-driver"]
    assert ray.get(_call_in_worker.remote(ns, "from-driver", "incr")) == 2
    assert ray.get(_call_in_worker.remote(ns, "from-driver", "incr")) == 3
    assert ray.get(_list_in_worker.remote(new_namespace())) == []


def test_session_affinity_from_any_worker(services: ServiceRegistry) -> None:
    services.register("sess", Sessions, num_replicas=2, num_cpus=0)
    ns = services.namespace
    services.client("sess").call("remember", "driver", session_id="s1")
    out = ray.get(_call_in_worker.remote(ns, "sess", "remember", "worker", session_id="s1"))
    assert out["seen"] == ["driver", "worker"]


@pytest.mark.parametrize("num_replicas", [1, 2])
def test_registration_race_between_workers(services: ServiceRegistry, num_replicas: int) -> None:
    ns = services.namespace
    outcomes = ray.get(
        [_register_in_worker.remote(ns, "contested", num_replicas) for _ in range(2)]
    )
    assert sorted(o.split(":")[0] for o in outcomes) == ["created", "error"]
    assert any("already exists" in o for o in outcomes)
    assert services.list() == ["contested"]
    assert len(_actors_of(ns)) == num_replicas


def test_registration_race_with_different_replica_counts(services: ServiceRegistry) -> None:
    ns = services.namespace
    outcomes = ray.get([_register_in_worker.remote(ns, "mixed", k) for k in (2, 3)])
    assert sorted(o.split(":")[0] for o in outcomes) == ["created", "error"]
    assert len(_actors_of(ns)) in (2, 3)  # the loser rolled back its replicas
    assert len(services.replicas("mixed")) == len(_actors_of(ns))


@pytest.mark.parametrize("num_replicas", [1, 3])
def test_get_or_register_race_gives_one_service(
    services: ServiceRegistry, num_replicas: int
) -> None:
    ns = services.namespace
    ids = ray.get([_get_or_register_in_worker.remote(ns, "shared", num_replicas) for _ in range(3)])
    assert len(set(ids)) == 1
    assert services.get("shared")._actor_id.hex() == ids[0]
    assert len(_actors_of(ns)) == num_replicas


# -- actor options --------------------------------------------------------------------------


def test_actor_option_names_come_from_ray() -> None:
    from toolservices.services._ray import ray_actor_option_names

    names = ray_actor_option_names()
    assert {"num_cpus", "max_restarts", "runtime_env", "concurrency_groups"} <= names


def test_register_splits_ray_options_from_constructor_args(services: ServiceRegistry) -> None:
    services.register("c", Counter, 5, num_cpus=0.5, marker="m", max_concurrency=2)
    client = services.client("c")
    assert client.call("incr") == 6
    assert ray.get(services["c"].whoami.remote()) == client.call("whoami")


def test_option_that_is_also_a_constructor_parameter_is_refused(services: ServiceRegistry) -> None:
    with pytest.raises(UserError, match="register_with_options"):
        services.register("m", WithMemoryParam, memory=3)
    services.register_with_options("m", WithMemoryParam, actor_options={"num_cpus": 0.25}, memory=3)
    client = services.client("m")
    assert client.call("get_memory") == 3
    assert client.call("resources") == {"CPU": 0.25}


def test_register_with_options_validates_option_names(services: ServiceRegistry) -> None:
    with pytest.raises(UserError, match="Unknown Ray actor option") as info:
        services.register_with_options("x", Counter, actor_options={"num_cpu": 1})
    assert "num_cpus" in str(info.value)
    with pytest.raises(UserError, match="set by the registry"):
        services.register_with_options("x", Counter, actor_options={"name": "other"})
    assert services.list() == []


def test_plain_function_factory_is_refused(services: ServiceRegistry) -> None:
    with pytest.raises(UserError, match="from classes"):
        services.register("f", lambda: Counter())


def test_ray_remote_class_is_accepted(services: ServiceRegistry) -> None:
    services.register("remote", ray.remote(Counter), 2)
    assert services.client("remote").call("incr") == 3


# -- failures ---------------------------------------------------------------------------------


def test_killed_actor_gives_clear_error_not_a_hang(services: ServiceRegistry) -> None:
    services.register("victim", Counter)
    client = services.client("victim")
    assert client.call("incr") == 1
    _kill(services["victim"])
    with pytest.raises(ServiceUnavailableError, match="victim.*died") as info:
        client.call("incr")
    assert not info.value.retryable
    assert "victim" not in services
    with pytest.raises(ServiceUnavailableError, match="no longer registered"):
        client.call("incr")
    services.register("victim", Counter, 100)  # the name is free again; the client follows it
    assert client.call("incr") == 101


async def test_killed_actor_async_client(services: ServiceRegistry) -> None:
    services.register("victim", Counter)
    client = services.client("victim")
    _kill(services["victim"])
    with pytest.raises(ServiceUnavailableError, match="died"):
        await client.acall("incr")


def test_restarting_actor_is_reported_as_retryable(services: ServiceRegistry) -> None:
    services.register("phoenix", Counter, 10, max_restarts=1)
    client = services.client("phoenix")
    assert client.call("incr") == 11
    _kill(services["phoenix"], restart=True)
    try:
        value = client.call("incr")
    except ServiceUnavailableError as exc:  # the usual case: Ray is still restarting it
        assert exc.retryable
        assert "restarting" in str(exc)
    else:  # the restart already finished: a fresh incarnation answered
        assert value == 11
    assert "phoenix" in services


def test_restart_with_task_retries_is_transparent(services: ServiceRegistry) -> None:
    services.register("phoenix", Counter, 10, max_restarts=1, max_task_retries=2)
    client = services.client("phoenix")
    assert client.call("incr") == 11
    _kill(services["phoenix"], restart=True)
    assert client.call("incr") == 11  # Ray waited for the restart; the state was rebuilt


def test_dead_replica_moves_only_its_sessions(services: ServiceRegistry) -> None:
    services.register("sess", Sessions, num_replicas=3, num_cpus=0)
    client = services.client("sess")
    sessions = [f"s{i}" for i in range(12)]
    before = {s: client.call("remember", 0, session_id=s)["replica"] for s in sessions}
    victim_session = sessions[0]
    victim_index = client.replica_for(victim_session)
    assert victim_index is not None
    _kill(services.replicas("sess")[victim_index])
    with pytest.raises(ServiceUnavailableError, match="remaining replicas") as info:
        client.call("remember", 1, session_id=victim_session)
    assert info.value.retryable
    after = {s: client.call("remember", 1, session_id=s)["replica"] for s in sessions}
    moved = {s for s in sessions if after[s] != before[s]}
    assert victim_session in moved
    assert all(before[s] == before[victim_session] for s in moved)
    # A fresh client (another worker) agrees with the old one on every session.
    fresh = services.client("sess")
    assert all(fresh.call("whoami", session_id=s) == after[s] for s in sessions)


def _executor_pid(handle: Any) -> int:
    return int(ray.get(handle.__ray_call__.remote(lambda self: os.getpid()), timeout=60))


def _kill_executor(handle: Any, *, restart: bool) -> None:
    pid = _executor_pid(handle)
    ray.kill(handle, no_restart=not restart)
    try:
        psutil.Process(pid).wait(timeout=30)
    except psutil.NoSuchProcess:
        pass


def _first_answer(client: Any, code: str, session_id: str) -> Any:
    """The call's result once Ray has restarted the replica (retryable errors until then)."""
    deadline = time.monotonic() + 60
    while True:
        try:
            return client.call("execute", code, session_id=session_id)
        except ServiceUnavailableError as exc:
            assert exc.retryable, exc
            assert time.monotonic() < deadline, "the replica never came back"


def test_sessions_of_a_restarted_executor_come_back_restarted(services: ServiceRegistry) -> None:
    services.register(
        "py", PythonExecutorService, pool_size=2, spares=0, num_cpus=0, max_restarts=1
    )
    client = services.client("py", timeout=60)
    assert client.call("execute", "v = 1", session_id="old")["success"]
    _kill_executor(services["py"], restart=True)

    lost = _first_answer(client, "print(v)", "old")
    assert lost.restarted and "NameError" in lost.stderr, lost
    again = client.call("execute", "v = 2; print(v)", session_id="old")
    assert not again.restarted and again.stdout == "2\n"
    new = client.call("execute", "print(3)", session_id="new")  # never used: plainly new
    assert not new.restarted and new.stdout == "3\n"
    # A closed session is new again, not lost.
    assert client.call("close_session", session_id="old")
    assert not client.call("execute", "v = 4", session_id="old").restarted


async def test_sessions_moved_off_a_dead_replica_come_back_restarted(
    services: ServiceRegistry,
) -> None:
    services.register(
        "py", PythonExecutorService, pool_size=2, spares=0, num_cpus=0, num_replicas=2
    )
    client = services.client("py", timeout=60)
    sessions = [f"m{i}" for i in range(8)]
    for i, session in enumerate(sessions):
        assert (await client.acall("execute", f"v = {i}", session_id=session))["success"]
    before = {s: client.replica_for(s) for s in sessions}
    victim = before[sessions[0]]
    assert victim is not None and len(set(before.values())) == 2
    _kill_executor(services.replicas("py")[victim], restart=False)
    with pytest.raises(ServiceUnavailableError, match="remaining replicas"):
        await client.acall("execute", "print(v)", session_id=sessions[0])
    for i, session in enumerate(sessions):
        out = await client.acall("execute", "print(v)", session_id=session)
        if before[session] == victim:  # moved to the other replica: its state is gone
            assert out.restarted and "NameError" in out.stderr, (session, out)
        else:
            assert not out.restarted and out.stdout == f"{i}\n", (session, out)
    assert not (await client.acall("execute", "v = 0", session_id=sessions[0])).restarted


def test_sync_call_timeout_cancels(services: ServiceRegistry) -> None:
    services.register("slow", Counter, max_concurrency=2)
    assert services.client("slow").call("incr") == 1  # the actor is up
    client = services.client("slow", timeout=0.5)
    with pytest.raises(ServiceTimeoutError, match="did not answer") as info:
        client.call("block", 10)
    assert info.value.retryable
    assert client.call("incr") == 2  # the second thread of the actor still answers


# -- teardown ------------------------------------------------------------------------------------


def test_reset_and_shutdown_kill_every_actor_of_the_namespace_only(
    services: ServiceRegistry,
) -> None:
    other = get_services("ray", namespace=new_namespace())
    try:
        services.register("a", Counter)
        services.register("b", Sessions, num_replicas=2, num_cpus=0)
        other.register("a", Counter)
        assert len(_actors_of(services.namespace)) == 3
        services.reset()
        assert _actors_of(services.namespace) == []
        assert other.client("a").call("incr") == 1
        services.register("c", Counter)
        services.shutdown()
        assert _actors_of(services.namespace) == []
        assert _actors_of(other.namespace) == ["a"]
    finally:
        other.shutdown()
    assert _actors_of(other.namespace) == []
