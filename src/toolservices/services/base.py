"""The backend-neutral registry interface and the client that consumers use.

A registry maps names to running services inside a namespace; the backend
decides where a service lives (this process, or a Ray actor somewhere in the
cluster). Code that *uses* a service goes through :class:`ServiceClient`,
whose ``call`` / ``acall`` look the same on every backend, so environments
and transforms never branch on it.
"""

from __future__ import annotations

import abc
import inspect
import logging
import sys
from collections.abc import Hashable, Mapping
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar, runtime_checkable

from toolservices.errors import (
    InfrastructureError,
    ServiceExistsError,
    ServiceNotFoundError,
    ServiceUnavailableError,
    UserError,
)
from toolservices.services._routing import ReplicaRouter

if TYPE_CHECKING:
    from typing_extensions import Self

__all__ = [
    "DEFAULT_NAMESPACE",
    "REPLICA_SEPARATOR",
    "Service",
    "ServiceClient",
    "ServiceRegistry",
]

_log = logging.getLogger(__name__)

#: TorchRL's default namespace, kept so that workers of both libraries agree.
DEFAULT_NAMESPACE = "torchrl_services"

#: Replica ``i`` (``i >= 1``) of service ``s`` is named ``s#replica<i>of<k>``;
#: replica 0 carries the plain name. ``#`` is therefore not allowed in names.
REPLICA_SEPARATOR = "#replica"

#: Our own option, accepted by both backends next to Ray's actor options.
NUM_REPLICAS = "num_replicas"


def replica_names(name: str, num_replicas: int) -> list[str]:
    """The names of the ``num_replicas`` replicas of service ``name``."""
    return [name] + [
        f"{name}{REPLICA_SEPARATOR}{i}of{num_replicas}" for i in range(1, num_replicas)
    ]


def constructor_parameters(factory: Any) -> set[str]:
    """Parameter names of ``factory`` (or of the class behind a ``@ray.remote`` class)."""
    metadata = getattr(factory, "__ray_metadata__", None)
    target = getattr(metadata, "modified_class", factory)
    try:
        return set(inspect.signature(target).parameters)
    except (TypeError, ValueError):
        return set()


def check_name(name: object) -> str:
    if not isinstance(name, str) or not name:
        raise UserError(f"A service name must be a non-empty string, got {name!r}")
    if "#" in name:
        raise UserError(f"Service name {name!r} contains '#', which is reserved for replicas")
    return name


def check_num_replicas(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise UserError(f"num_replicas must be a positive integer, got {value!r}")
    return value


def exists_error(name: str, namespace: str) -> ServiceExistsError:
    return ServiceExistsError(f"Service '{name}' already exists in namespace '{namespace}'")


def not_found_error(name: str, namespace: str, available: list[str]) -> ServiceNotFoundError:
    listed = ", ".join(available) or "none"
    return ServiceNotFoundError(
        f"Service '{name}' not found in namespace '{namespace}'. Available services: {listed}"
    )


#: (service name, what its close raised), as collected by a backend's reset.
CloseFailures = list[tuple[str, BaseException]]

ClientT = TypeVar("ClientT", covariant=True)


@runtime_checkable
class Service(Protocol, Generic[ClientT]):
    """A service that owns its own lifecycle (TorchRL 0.14's owner protocol).

    Registering a *started* owner (``registry.register(name, owner)``) shares
    its :meth:`client` under ``name``; the registry never starts or stops
    the owner, so ``reset()`` only removes the name. The client is what
    peers get from ``get_client(name)``: cheap, picklable (on Ray it is
    stored in the cluster), and without ``start`` / ``shutdown``.
    """

    def start(self) -> Self:
        """Start the owned resources and return ``self``."""
        ...

    def shutdown(self, timeout: float | None = None) -> None:
        """Stop the owned resources."""
        ...

    def client(self) -> ClientT:
        """The capability-restricted handle that peers use."""
        ...

    @property
    def is_alive(self) -> bool:
        """Whether the owner is running."""
        ...


def is_service_owner(obj: object) -> bool:
    """``obj`` is a :class:`Service` instance (a class with those methods is a factory)."""
    return not isinstance(obj, type) and isinstance(obj, Service)


def owner_client(name: str, owner: Any, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> Any:
    """The client to share for ``owner``, after TorchRL's checks (no arguments, started)."""
    if args or kwargs:
        raise TypeError(
            f"Service '{name}': constructor arguments or placement options cannot be given "
            f"when registering a running Service owner ({type(owner).__name__}); got "
            f"{len(args)} positional and {sorted(kwargs)} keyword argument(s)"
        )
    if not owner.is_alive:
        raise RuntimeError(
            f"Service '{name}' must be started before registration "
            f"({type(owner).__name__}.is_alive is False; call its start() first)"
        )
    return owner.client()


def legacy_registration_error(name: str, namespace: str) -> TypeError:
    return TypeError(
        f"Service '{name}' in namespace '{namespace}' is a legacy raw actor registration "
        "(created from a class or factory), not a Service owner: use get(name) or "
        "client(name), or register a running Service owner to share its client"
    )


def owned_service_error(name: str, namespace: str) -> UserError:
    return UserError(
        f"Service '{name}' in namespace '{namespace}' was registered as a Service owner: "
        "call its client directly (get_client(name)); client(name) routes calls to "
        "services the registry created"
    )


class ServiceRegistry(abc.ABC):
    """Named services shared by every registry object of one backend and namespace.

    The contract's methods (``register``, ``register_with_options``, ``get`` /
    ``[]``, ``in``, ``list``, ``reset``, ``shutdown``, ``[name] = factory``)
    plus ``get_or_register`` and ``client``.
    """

    backend: str = ""

    def __init__(self, *, namespace: str = DEFAULT_NAMESPACE) -> None:
        if not isinstance(namespace, str) or not namespace:
            raise UserError(f"namespace must be a non-empty string, got {namespace!r}")
        self.namespace = namespace

    # -- registration --------------------------------------------------------------

    def register(self, name: str, factory: Any, *args: Any, **kwargs: Any) -> Any:
        """Create service ``name`` from ``factory(*args, **kwargs)`` and return it.

        ``num_replicas=k`` and Ray's actor option names (``num_cpus``,
        ``num_gpus``, ``resources``, ``max_restarts``...) are taken out of
        ``kwargs`` (the local backend ignores Ray's); the rest goes to the
        factory. Raises a ``ValueError`` containing "already exists" when the
        name is taken.

        ``factory`` may instead be a running :class:`Service` owner: its
        ``client()`` is shared under ``name`` and returned, and the registry
        never shuts the owner down.
        """
        check_name(name)
        if is_service_owner(factory):
            return self._register_client(name, owner_client(name, factory, args, kwargs))
        ctor_kwargs, options = self._split_options(factory, kwargs)
        num_replicas = check_num_replicas(options.pop(NUM_REPLICAS, 1))
        return self._register(name, factory, args, ctor_kwargs, options, num_replicas)

    def register_with_options(
        self,
        name: str,
        factory: Any,
        actor_options: Mapping[str, Any] | None = None,
        **ctor_kwargs: Any,
    ) -> Any:
        """Like :meth:`register`, with placement options kept apart from the factory's.

        ``actor_options`` may hold ``num_replicas`` and, on Ray, any option
        that ``ActorClass.options()`` accepts; ``ctor_kwargs`` all go to the
        factory, whatever their names.
        """
        check_name(name)
        if is_service_owner(factory):
            client = owner_client(name, factory, (), {**(actor_options or {}), **ctor_kwargs})
            return self._register_client(name, client)
        options = self._check_options(dict(actor_options or {}))
        num_replicas = check_num_replicas(options.pop(NUM_REPLICAS, 1))
        return self._register(name, factory, (), ctor_kwargs, options, num_replicas)

    def get_or_register(self, name: str, factory: Any, *args: Any, **kwargs: Any) -> Any:
        """Return service ``name``, registering it with ``register``'s arguments if missing.

        Safe when many workers do this at once: exactly one creates it.
        """
        try:
            return self.register(name, factory, *args, **kwargs)
        except ServiceExistsError:
            return self._wait_registered(name)

    def __setitem__(self, name: str, factory: Any) -> None:
        self.register(name, factory)

    # -- lookup ---------------------------------------------------------------------

    def __getitem__(self, name: str) -> Any:
        return self.get(name)

    @abc.abstractmethod
    def get(self, name: str) -> Any:
        """The service (local) or its actor handle (Ray); ``KeyError`` "not found" if missing.

        For a replicated service this is replica 0; use :meth:`client` to
        reach all of them.
        """

    @abc.abstractmethod
    def get_client(self, name: str) -> Any:
        """The client of a :class:`Service` owner registered under ``name``.

        ``KeyError`` ("not found") if ``name`` is not registered;
        ``TypeError`` for a service the registry created from a class or
        factory (a "legacy raw actor registration" in TorchRL's words).
        """

    @abc.abstractmethod
    def replicas(self, name: str) -> list[Any]:
        """Every replica of service ``name`` (objects locally, actor handles on Ray)."""

    @abc.abstractmethod
    def __contains__(self, name: object) -> bool: ...

    @abc.abstractmethod
    def list(self) -> list[str]:
        """Sorted names of the services of this namespace."""

    @abc.abstractmethod
    def client(self, name: str, *, timeout: float | None = None) -> ServiceClient:
        """A backend-neutral caller for service ``name`` (routes across replicas)."""

    # -- teardown -----------------------------------------------------------------------

    def reset(self) -> None:
        """Close and remove every service of this namespace; other namespaces are untouched.

        Every service is terminated even if some fail to close; the failures
        are raised together afterwards as an :class:`InfrastructureError`.
        Running :class:`Service` owners are only forgotten, never shut down.

        Called while an exception is propagating (in a ``finally:`` or
        ``except:`` block), ``reset`` does not replace that exception with
        its own: the close failures are logged as a warning and added to the
        propagating exception as a note.
        """
        failures = self._reset()
        if not failures:
            return
        detail = "; ".join(f"{name}: {exc!r}" for name, exc in failures)
        message = (
            f"{len(failures)} service(s) of namespace '{self.namespace}' failed to close"
            f"{self._close_failure_suffix}: {detail}"
        )
        in_flight = sys.exc_info()[1]
        if in_flight is None:
            raise InfrastructureError(message) from failures[0][1]
        _log.warning("%s (not raised: %r is propagating)", message, in_flight)
        if hasattr(in_flight, "add_note"):  # Python 3.11+
            in_flight.add_note(f"While it propagated, {type(self).__name__}.reset(): {message}")

    #: Added to the close-failure message (what happened to the services anyway).
    _close_failure_suffix = ""

    @abc.abstractmethod
    def _reset(self) -> CloseFailures:
        """Remove every service of the namespace; return the (name, error) close failures."""

    def shutdown(self, raise_on_error: bool = True) -> None:
        """Terminate this namespace's services (never the Ray cluster itself).

        With ``raise_on_error=False`` close failures are logged instead of raised.
        """
        try:
            self.reset()
        except InfrastructureError:
            if raise_on_error:
                raise
            _log.warning(
                "errors while shutting down services of namespace %r", self.namespace, exc_info=True
            )

    # -- backend hooks --------------------------------------------------------------------

    @abc.abstractmethod
    def _split_options(
        self, factory: Any, kwargs: dict[str, Any]
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        """Split ``register``'s kwargs into (factory kwargs, options)."""

    def _check_options(self, options: dict[str, Any]) -> dict[str, Any]:
        """Validate explicit ``actor_options``; backends that understand them override."""
        return options

    @abc.abstractmethod
    def _register(
        self,
        name: str,
        factory: Any,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        options: dict[str, Any],
        num_replicas: int,
    ) -> Any: ...

    @abc.abstractmethod
    def _register_client(self, name: str, client: Any) -> Any:
        """Share ``client`` (of a running owner) under ``name``; return it."""

    @abc.abstractmethod
    def _wait_registered(self, name: str) -> Any:
        """``get(name)``, waiting for a registration that another worker has begun."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}(namespace={self.namespace!r})"


class ServiceClient(abc.ABC):
    """Calls methods of a registered service the same way on every backend.

    ``call`` blocks, ``acall`` is awaitable. A ``session_id=`` keyword routes
    the call to the replica holding that session (and is passed on to the
    method); calls without one go to the least busy replica. A service that
    is gone raises :class:`~toolservices.errors.ServiceUnavailableError`.
    """

    def __init__(
        self, name: str, namespace: str, replicas: list[str], *, timeout: float | None
    ) -> None:
        self.name = name
        self.namespace = namespace
        self.timeout = timeout
        self._router = ReplicaRouter(replicas)

    @property
    def num_replicas(self) -> int:
        return len(self._router.replicas)

    def replica_for(self, session_id: Hashable) -> int | None:
        """Index of the live replica that serves ``session_id`` (None if none is live)."""
        return self._router.pick(session_id)

    def in_flight(self) -> list[int]:
        """Calls of this client currently running, per replica."""
        return self._router.in_flight()

    def call(self, method: str, /, *args: Any, **kwargs: Any) -> Any:
        """``service.method(*args, **kwargs)``, blocking until the result is back."""
        index = self._route(kwargs.get("session_id"))
        self._router.started(index)
        try:
            return self._call(index, method, args, kwargs)
        finally:
            self._router.finished(index)

    async def acall(self, method: str, /, *args: Any, **kwargs: Any) -> Any:
        """``await service.method(*args, **kwargs)`` without blocking the event loop.

        If the service defines an ``a``-prefixed coroutine twin of ``method``
        (``execute`` / ``aexecute``), the twin is used.
        """
        index = self._route(kwargs.get("session_id"))
        self._router.started(index)
        try:
            return await self._acall(index, method, args, kwargs)
        finally:
            self._router.finished(index)

    def _route(self, session_id: Hashable | None) -> int:
        index = self._router.pick(session_id)
        if index is None:
            raise ServiceUnavailableError(
                f"Service '{self.name}' in namespace '{self.namespace}' has no live replica "
                f"(all {self.num_replicas} died); register it again",
                retryable=False,
            )
        return index

    @abc.abstractmethod
    def _call(
        self, index: int, method: str, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Any: ...

    @abc.abstractmethod
    async def _acall(
        self, index: int, method: str, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Any: ...

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}({self.name!r}, namespace={self.namespace!r}, "
            f"replicas={self.num_replicas})"
        )
