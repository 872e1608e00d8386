"""Fixtures for the service registry: both backends, one real local Ray for the package."""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from toolservices.services import ServiceRegistry, get_services


def _load_helpers() -> Any:
    """Import svc_helpers.py as a top-level module (the suite uses importlib import mode)."""
    if "svc_helpers" in sys.modules:
        return sys.modules["svc_helpers"]
    spec = importlib.util.spec_from_file_location(
        "svc_helpers", Path(__file__).with_name("svc_helpers.py")
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["svc_helpers"] = module
    spec.loader.exec_module(module)
    return module


svc_helpers = _load_helpers()
new_namespace = svc_helpers.new_namespace

RAY_INIT_CONFIG = svc_helpers.RAY_INIT_CONFIG


@pytest.fixture(scope="package")
def ray_started() -> Iterator[dict[str, Any]]:
    """Starts Ray through the registry's ``ray_init_config`` once; stops it at the end."""
    ray = pytest.importorskip("ray")
    was_running = ray.is_initialized()
    ray.cloudpickle.register_pickle_by_value(svc_helpers)
    get_services("ray", namespace="tests-bootstrap", ray_init_config=RAY_INIT_CONFIG)
    try:
        yield {"was_running": was_running}
    finally:
        if not was_running:
            ray.shutdown()


@pytest.fixture(params=["local", pytest.param("ray", marks=pytest.mark.ray)])
def backend(request: pytest.FixtureRequest) -> str:
    if request.param == "ray":
        request.getfixturevalue("ray_started")
    return str(request.param)


@pytest.fixture
def namespace() -> str:
    return new_namespace()


@pytest.fixture
def registry(backend: str, namespace: str) -> Iterator[ServiceRegistry]:
    services = get_services(backend, namespace=namespace)
    try:
        yield services
    finally:
        services.reset()
