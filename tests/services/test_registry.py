"""The registry contract and the client, on both backends (one parametrized fixture)."""

from __future__ import annotations

import pickle
import subprocess
import sys
import threading
from collections import Counter as Tally
from pathlib import Path

import anyio
import pytest
from svc_helpers import (
    BrokenInit,
    Closing,
    Counter,
    Sessions,
    TakesReplicas,
    new_namespace,
    wait_running,
)

from toolservices.errors import (
    InfrastructureError,
    ServiceTimeoutError,
    ServiceUnavailableError,
    UserError,
)
from toolservices.services import LocalServiceRegistry, ServiceRegistry, get_services

pytestmark = pytest.mark.timeout(120)


def test_default_backend_is_local() -> None:
    assert isinstance(get_services(), LocalServiceRegistry)


def test_local_backend_does_not_import_ray() -> None:
    code = (
        "import sys\n"
        "from toolservices import get_services\n"
        "s = get_services(namespace='n')\n"
        "s.register('c', dict)\n"
        "s.reset()\n"
        "print('ray' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"


def test_unknown_backend_names_the_valid_ones() -> None:
    with pytest.raises(ValueError, match="Unsupported backend") as info:
        get_services("dask")
    assert "'local'" in str(info.value) and "'ray'" in str(info.value)


def test_register_get_contains_list(registry: ServiceRegistry) -> None:
    registry.register("b", Counter, 3)
    registry["a"] = Counter
    assert registry.list() == ["a", "b"]
    assert "a" in registry and "missing" not in registry
    assert registry.client("b").call("incr") == 4
    if registry.backend == "local":
        assert isinstance(registry.get("a"), Counter)
        assert registry["a"] is registry.get("a")


def test_duplicate_name_raises_already_exists(registry: ServiceRegistry) -> None:
    registry.register("svc", Counter)
    with pytest.raises(ValueError, match="already exists"):
        registry.register("svc", Counter)
    assert registry.list() == ["svc"]


def test_missing_name_raises_not_found(registry: ServiceRegistry) -> None:
    registry.register("present", Counter)
    with pytest.raises(KeyError, match="not found") as info:
        registry["absent"]
    assert "present" in str(info.value)
    with pytest.raises(KeyError, match="not found"):
        registry.client("absent")


def test_bad_names_and_factories_are_user_errors(registry: ServiceRegistry) -> None:
    with pytest.raises(UserError, match="non-empty string"):
        registry.register("", Counter)
    with pytest.raises(UserError, match="reserved for replicas"):
        registry.register("a#b", Counter)
    with pytest.raises(UserError, match="num_replicas"):
        registry.register("x", Counter, num_replicas=0)
    with pytest.raises(UserError):
        registry.register("y", 42)
    assert registry.list() == []


def test_num_replicas_clash_needs_explicit_options(registry: ServiceRegistry) -> None:
    with pytest.raises(UserError, match="register_with_options"):
        registry.register("x", TakesReplicas, num_replicas=2)
    registry.register_with_options("x", TakesReplicas, actor_options={}, num_replicas=5)
    assert registry.client("x").call("get") == 5


def test_failed_constructor_leaves_nothing(registry: ServiceRegistry) -> None:
    if registry.backend == "local":
        with pytest.raises(RuntimeError, match="constructor failed"):
            registry.register("broken", BrokenInit)
        assert "broken" not in registry
    else:  # Ray builds the actor asynchronously: the first call reports it
        registry.register("broken", BrokenInit)
        with pytest.raises(ServiceUnavailableError, match="died"):
            registry.client("broken").call("ping")
        assert "broken" not in registry


def test_two_registry_objects_share_a_namespace(backend: str, registry: ServiceRegistry) -> None:
    registry.register("shared", Counter, 10)
    other = get_services(backend, namespace=registry.namespace)
    assert other.list() == ["shared"]
    assert other.client("shared").call("incr") == 11
    assert registry.client("shared").call("incr") == 12


def test_namespaces_are_isolated(backend: str, registry: ServiceRegistry) -> None:
    other = get_services(backend, namespace=new_namespace())
    try:
        registry.register("same", Counter, 1)
        other.register("same", Counter, 100)
        assert registry.client("same").call("incr") == 2
        assert other.client("same").call("incr") == 101
        registry.reset()
        assert registry.list() == []
        assert other.list() == ["same"]
        assert other.client("same").call("incr") == 102
    finally:
        other.reset()


def test_get_or_register(registry: ServiceRegistry) -> None:
    registry.get_or_register("svc", Counter, 5)
    registry.get_or_register("svc", Counter, 1000)  # already there: not replaced
    assert registry.client("svc").call("incr") == 6


def test_reset_closes_services(registry: ServiceRegistry, tmp_path: Path) -> None:
    log = tmp_path / "closed.txt"
    registry.register("one", Closing, str(log))
    registry.register("two", Closing, str(log), num_replicas=2)
    wait_running(registry, "one")
    wait_running(registry, "two")
    registry.reset()
    assert registry.list() == []
    assert log.read_text().count("closed") == 3


def test_reset_raises_close_failures_after_removing_everything(
    registry: ServiceRegistry, tmp_path: Path
) -> None:
    log = tmp_path / "closed.txt"
    registry.register("bad", Closing, str(log), fail=True)
    registry.register("good", Closing, str(log))
    wait_running(registry, "bad")
    wait_running(registry, "good")
    with pytest.raises(InfrastructureError, match="close failed on purpose"):
        registry.reset()
    assert registry.list() == []
    assert log.read_text().count("closed") == 2


def test_shutdown_without_raising(registry: ServiceRegistry, tmp_path: Path) -> None:
    registry.register("bad", Closing, str(tmp_path / "log"), fail=True)
    registry.shutdown(raise_on_error=False)
    assert registry.list() == []
    registry.register("bad", Closing, str(tmp_path / "log"), fail=True)
    wait_running(registry, "bad")
    with pytest.raises(InfrastructureError):
        registry.shutdown()


def test_client_after_reset_reports_unavailable(registry: ServiceRegistry) -> None:
    registry.register("svc", Counter)
    client = registry.client("svc")
    assert client.call("incr") == 1
    registry.reset()
    with pytest.raises(ServiceUnavailableError) as info:
        client.call("incr")
    assert not info.value.retryable
    assert "svc" in str(info.value)


def test_service_exceptions_pass_through(registry: ServiceRegistry) -> None:
    registry.register("svc", Counter)
    with pytest.raises(ValueError, match="Test error"):
        registry.client("svc").call("fail")
    with pytest.raises(AttributeError, match="no method 'nope'"):
        registry.client("svc").call("nope")


async def test_async_client(registry: ServiceRegistry) -> None:
    registry.register("svc", Counter, 1)
    client = registry.client("svc")
    assert await client.acall("incr", 2) == 3
    assert client.call("incr") == 4


async def test_acall_uses_async_twin(registry: ServiceRegistry) -> None:
    registry.register("sess", Sessions)
    client = registry.client("sess")
    out = await client.acall("remember", 1, session_id="s")
    assert out["seen"] == [1]
    assert client.call("twins") == 1


async def test_acall_timeout(registry: ServiceRegistry) -> None:
    registry.register("svc", Counter)
    client = registry.client("svc", timeout=0.2)
    with pytest.raises(ServiceTimeoutError, match="did not answer") as info:
        await client.acall("block", 30)
    assert info.value.retryable


def test_concurrent_registration_one_winner(backend: str, namespace: str) -> None:
    """Threads with their own registry objects race for one name."""
    n = 4
    barrier = threading.Barrier(n)
    outcomes: list[str] = []

    def worker() -> None:
        services = get_services(backend, namespace=namespace)
        barrier.wait(timeout=30)
        try:
            services.register("contested", Counter)
            outcomes.append("created")
        except ValueError as exc:
            assert "already exists" in str(exc)
            outcomes.append("exists")

    threads = [threading.Thread(target=worker) for _ in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    services = get_services(backend, namespace=namespace)
    try:
        assert sorted(outcomes) == ["created"] + ["exists"] * (n - 1)
        assert services.list() == ["contested"]
    finally:
        services.reset()


# -- replicas -----------------------------------------------------------------------------


def test_replicas_session_affinity(backend: str, registry: ServiceRegistry) -> None:
    registry.register("sess", Sessions, num_replicas=3)
    assert registry.list() == ["sess"]
    assert len(registry.replicas("sess")) == 3
    client = registry.client("sess")
    assert client.num_replicas == 3
    seen_replicas = set()
    for session in ("a", "b", "c", "d", "e", "f"):
        for turn in range(3):
            out = client.call("remember", turn, session_id=session)
            assert out["seen"] == list(range(turn + 1))  # every turn reached the same replica
        seen_replicas.add(out["replica"])
    assert len(seen_replicas) > 1  # sessions are spread
    # A second registry object (another worker) routes the same way.
    other = get_services(backend, namespace=registry.namespace).client("sess")
    assert other.call("remember", 3, session_id="a")["seen"] == [0, 1, 2, 3]


def test_replicas_balance_calls_without_session(registry: ServiceRegistry) -> None:
    registry.register("c", Counter, num_replicas=3)
    client = registry.client("c")
    tally = Tally(client.call("whoami") for _ in range(6))
    assert sorted(tally.values()) == [2, 2, 2]


async def test_replicas_least_in_flight(registry: ServiceRegistry) -> None:
    registry.register("s", Sessions, num_replicas=3)
    client = registry.client("s")
    results: list[str] = []

    async def one() -> None:
        results.append(await client.acall("hold", 0.05))

    async with anyio.create_task_group() as tg:
        for _ in range(6):
            tg.start_soon(one)
    assert sorted(Tally(results).values()) == [2, 2, 2]
    assert client.in_flight() == [0, 0, 0]


def test_local_client_refuses_to_be_pickled() -> None:
    registry = get_services("local", namespace=new_namespace())
    try:
        registry.register("svc", Counter)
        with pytest.raises(TypeError, match="cannot leave its process"):
            pickle.dumps(registry.client("svc"))
    finally:
        registry.reset()
