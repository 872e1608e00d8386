"""TorchRL 0.14.1's service surface under our names: owners, get_client, placement options.

``from torchrl.services import X`` becomes ``from toolservices import X``; these
tests pin what that promises on both backends.
"""

from __future__ import annotations

import logging
import pickle
import subprocess
import sys
from pathlib import Path

import pytest
from svc_helpers import (
    Closing,
    Counter,
    Owner,
    OwnerClient,
    Tokenizer,
    WithMemoryParam,
    wait_running,
)

import toolservices
from toolservices.errors import InfrastructureError, UserError
from toolservices.services import (
    LocalServiceRegistry,
    RayServiceRegistry,
    ServiceRegistry,
    get_services,
)
from toolservices.services._local import RAY_PLACEMENT_OPTIONS

pytestmark = pytest.mark.timeout(120)


def test_torchrl_names_are_importable_where_torchrl_users_import_them() -> None:
    from toolservices import RayService, Service, ServiceBackend, ServiceBase, services

    assert RayService is RayServiceRegistry is services.RayService
    assert ServiceBase is ServiceRegistry is services.ServiceBase
    assert Service is services.Service
    assert ServiceBackend is services.ServiceBackend
    assert isinstance(get_services(), ServiceBase)
    assert {"RayService", "Service", "ServiceBackend", "ServiceBase"} <= set(toolservices.__all__)


def test_the_names_do_not_import_ray() -> None:
    code = (
        "import sys\n"
        "from toolservices import RayService, Service, ServiceBase, get_services\n"
        "print('ray' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"


def test_get_services_ray_is_a_ray_service(ray_started: dict[str, object]) -> None:
    from toolservices import RayService, get_services

    registry = get_services("ray", namespace="t-names")
    assert isinstance(registry, RayService)


# -- the Service owner protocol ----------------------------------------------------------


def test_owner_is_recognised_by_the_protocol() -> None:
    from toolservices import Service

    assert isinstance(Owner(), Service)
    assert not isinstance(Counter(), Service)
    assert isinstance(Owner, type)  # the class is a factory, only an instance is an owner


def test_register_a_running_owner_shares_its_client(
    backend: str, registry: ServiceRegistry, namespace: str
) -> None:
    owner = Owner(value=42).start()
    registered = registry.register("external", owner)
    assert isinstance(registered, OwnerClient) and registered.value == 42
    assert not hasattr(registered, "shutdown")

    peer = get_services(backend, namespace=namespace)  # another registry object, same namespace
    found = peer.get_client("external")
    assert (found.owner_id, found.value) == (owner.ident, 42)
    assert peer.get("external").owner_id == owner.ident
    assert peer["external"].value == 42
    assert "external" in peer and peer.list() == ["external"]

    registry.reset()
    assert owner.is_alive and owner.shutdowns == 0  # the registry never stops an owner
    assert "external" not in registry and peer.list() == []


def test_get_client_refuses_a_class_registration(registry: ServiceRegistry) -> None:
    registry.register("counter", Counter, 3)
    with pytest.raises(TypeError, match="legacy raw actor registration"):
        registry.get_client("counter")
    with pytest.raises(KeyError, match="not found"):
        registry.get_client("missing")


def test_owner_registration_errors(registry: ServiceRegistry) -> None:
    with pytest.raises(RuntimeError, match="must be started before registration"):
        registry.register("idle", Owner())
    owner = Owner().start()
    with pytest.raises(TypeError, match="cannot be given"):
        registry.register("args", owner, 1)
    with pytest.raises(TypeError, match="cannot be given"):
        registry.register("opts", owner, num_cpus=1)
    with pytest.raises(TypeError, match="cannot be given"):
        registry.register_with_options("opts", owner, actor_options={"num_cpus": 1})
    assert registry.list() == []
    registry.register("owner", owner)
    with pytest.raises(ValueError, match="already exists"):
        registry.register("owner", Owner().start())
    with pytest.raises(ValueError, match="already exists"):
        registry.register("owner", Counter)
    with pytest.raises(UserError, match="get_client"):
        registry.client("owner")


def test_unpicklable_client_cannot_be_shared_over_ray(
    ray_started: dict[str, object], namespace: str
) -> None:
    class Local(Owner):
        def client(self) -> OwnerClient:
            client = OwnerClient(self.ident, 1)
            client.lock = __import__("threading").Lock()  # type: ignore[attr-defined]
            return client

    registry = get_services("ray", namespace=namespace)
    with pytest.raises(UserError, match="picklable"):
        registry.register("x", Local().start())
    assert registry.list() == []


# -- Ray placement options on the local backend --------------------------------------------


def test_torchrl_register_example_runs_on_the_local_backend(
    namespace: str, caplog: pytest.LogCaptureFixture
) -> None:
    services = get_services(namespace=namespace)
    try:
        with caplog.at_level(logging.DEBUG, logger="toolservices.services._local"):
            tokenizer = services.register(
                "tokenizer",
                Tokenizer,
                num_cpus=1,
                num_gpus=0.1,
                resources={"accelerator": 1},
                max_restarts=3,
                vocab_size=7,
            )
        assert tokenizer.vocab_size == 7 and services["tokenizer"] is tokenizer
        ignored = [r.getMessage() for r in caplog.records if "ignoring" in r.getMessage()]
        assert ignored == [
            "local services backend: ignoring placement option(s) max_restarts, num_cpus, "
            "num_gpus, resources (they apply to Ray)"
        ]
        services.register_with_options(
            "tok2", Tokenizer, actor_options={"num_cpus": 2, "max_concurrency": 4}, vocab_size=5
        )
        assert services["tok2"].vocab_size == 5
    finally:
        services.reset()


def test_an_option_that_is_also_a_constructor_parameter_needs_explicit_options(
    registry: ServiceRegistry,
) -> None:
    with pytest.raises(UserError, match="register_with_options"):
        registry.register("m", WithMemoryParam, memory=5)
    registry.register_with_options("m", WithMemoryParam, actor_options={}, memory=5)
    assert registry.client("m").call("get_memory") == 5


def test_local_placement_options_are_rays_public_options() -> None:
    pytest.importorskip("ray")
    from toolservices.services._ray import _RESERVED_OPTIONS, ray_actor_option_names

    public = {n for n in ray_actor_option_names() if not n.startswith("_")}
    assert public - _RESERVED_OPTIONS == RAY_PLACEMENT_OPTIONS


# -- reset during an exception -----------------------------------------------------------------


def test_reset_in_finally_does_not_replace_the_callers_error(
    registry: ServiceRegistry, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    registry.register("bad", Closing, str(tmp_path / "log"), fail=True)
    wait_running(registry, "bad")  # it runs, so reset() closes it
    with caplog.at_level(logging.WARNING), pytest.raises(KeyError, match="the test's own") as info:
        try:
            raise KeyError("the test's own error")
        finally:
            registry.reset()
    assert registry.list() == []
    notes = getattr(info.value, "__notes__", [])
    if sys.version_info >= (3, 11):
        assert len(notes) == 1 and "close failed on purpose" in notes[0]
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("failed to close" in m and "KeyError" in m for m in warned)
    # Outside an exception the same failure raises.
    registry.register("bad", Closing, str(tmp_path / "log"), fail=True)
    wait_running(registry, "bad")
    with pytest.raises(InfrastructureError, match="close failed on purpose"):
        registry.reset()


@pytest.mark.ray
def test_reset_kills_an_actor_that_was_never_scheduled_without_closing_it(
    ray_started: dict[str, object], namespace: str, tmp_path: Path
) -> None:
    """More CPUs than the cluster has: the actor never starts, so there is nothing to
    close; reset() must not wait for a close() that cannot run (it used to raise
    "close() took over 10 s")."""
    registry = get_services("ray", namespace=namespace)
    registry.register("big", Closing, str(tmp_path / "log"), num_cpus=64)
    assert registry.list() == ["big"]
    registry.reset()
    assert registry.list() == []
    assert not (tmp_path / "log").exists()


def test_local_registry_pickles_by_namespace_only() -> None:
    registry = LocalServiceRegistry(namespace="t-pickle")
    assert pickle.loads(pickle.dumps(registry)).namespace == "t-pickle"
