"""Shared services (interpreter pools, indexes, gateways) by name, in-process or on Ray.

``get_services()`` returns a registry for one backend and namespace::

    services = get_services()                    # in this process
    services = get_services("ray", namespace="rl")  # named actors on a Ray cluster
    services.get_or_register("python", PythonExecutorService, pool_size=8, num_replicas=2)
    client = services.client("python")
    client.call("execute", "x = 1", session_id="env-0")   # same code on both backends

Ray is imported only when the Ray backend is asked for.

TorchRL 0.14.1's names are here too: ``ServiceBase`` (the registry base
class), ``RayService`` (the Ray registry), ``Service`` (the owner protocol)
and ``ServiceBackend``; ``get_client(name)`` returns the client of a
registered :class:`Service` owner.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal

from toolservices.errors import UserError
from toolservices.services._executor import ServiceExecutor
from toolservices.services._local import LocalServiceClient, LocalServiceRegistry
from toolservices.services.base import DEFAULT_NAMESPACE, Service, ServiceClient, ServiceRegistry

if TYPE_CHECKING:
    from toolservices.services._ray import RayServiceClient, RayServiceRegistry

    RayService = RayServiceRegistry

__all__ = [
    "BACKENDS",
    "DEFAULT_NAMESPACE",
    "LocalServiceClient",
    "LocalServiceRegistry",
    "RayService",
    "RayServiceClient",
    "RayServiceRegistry",
    "Service",
    "ServiceBackend",
    "ServiceBase",
    "ServiceClient",
    "ServiceExecutor",
    "ServiceRegistry",
    "get_services",
]

#: Valid ``backend`` names for :func:`get_services`.
BACKENDS = ("local", "ray")

#: The type of :func:`get_services`'s ``backend`` argument.
ServiceBackend = Literal["local", "ray"]

#: TorchRL's name of the registry base class.
ServiceBase = ServiceRegistry


def get_services(backend: str = "local", **init_kwargs: Any) -> ServiceRegistry:
    """The service registry of ``backend`` ("local" or "ray").

    ``init_kwargs`` go to the registry: ``namespace=`` for both, and
    ``ray_init_config=`` (passed to ``ray.init`` if Ray is not running) for Ray.
    """
    if backend == "local":
        return LocalServiceRegistry(**init_kwargs)
    if backend == "ray":
        from toolservices.services._ray import RayServiceRegistry

        return RayServiceRegistry(**init_kwargs)
    raise UserError(
        f"Unsupported backend: {backend!r}. Available backends: {', '.join(map(repr, BACKENDS))}"
    )


def __getattr__(name: str) -> Any:
    if name in ("RayServiceRegistry", "RayServiceClient", "RayService"):
        from toolservices.services import _ray

        # RayService: TorchRL's name of the Ray registry (same class).
        return getattr(_ray, "RayServiceRegistry" if name == "RayService" else name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
