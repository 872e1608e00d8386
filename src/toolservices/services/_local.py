"""The embedded backend: services are plain objects in this process.

One process-wide table, keyed by namespace, so that every registry object of
a namespace sees the same services. A name is reserved under the table's lock
*before* the factory runs (outside the lock), which makes two concurrent
registrations end with one service and one "already exists" error without
holding the lock during a slow constructor.

Ray's placement options (``num_cpus``, ``num_gpus``, ``resources``,
``max_restarts``...) mean nothing in one process: ``register`` takes them out
of the keyword arguments and ignores them (logged at debug level), so code
written for TorchRL's Ray registry runs unchanged here.
"""

from __future__ import annotations

import functools
import inspect
import logging
import threading
from typing import Any

import anyio
import anyio.to_thread

from toolservices.errors import (
    ServiceTimeoutError,
    ServiceUnavailableError,
    UserError,
)
from toolservices.services.base import (
    DEFAULT_NAMESPACE,
    NUM_REPLICAS,
    CloseFailures,
    ServiceClient,
    ServiceRegistry,
    constructor_parameters,
    exists_error,
    legacy_registration_error,
    not_found_error,
    owned_service_error,
    replica_names,
)

__all__ = ["RAY_PLACEMENT_OPTIONS", "LocalServiceClient", "LocalServiceRegistry"]

_log = logging.getLogger(__name__)

#: Ray's public actor options (``ActorClass.options()``), minus ``name``,
#: ``namespace`` and ``get_if_exists``, which the Ray registry sets itself. A
#: fixed list, so that the local backend never imports Ray; a test compares
#: it with the table of the installed Ray.
RAY_PLACEMENT_OPTIONS = frozenset(
    {
        "accelerator_type",
        "allow_out_of_order_execution",
        "concurrency_groups",
        "enable_task_events",
        "enable_tensor_transport",
        "fallback_strategy",
        "label_selector",
        "lifetime",
        "max_concurrency",
        "max_pending_calls",
        "max_restarts",
        "max_task_retries",
        "memory",
        "num_cpus",
        "num_gpus",
        "object_store_memory",
        "placement_group",
        "placement_group_bundle_index",
        "placement_group_capture_child_tasks",
        "resources",
        "runtime_env",
        "scheduling_strategy",
    }
)


class _Entry:
    """One registered service: its replicas once built, and whether it still exists."""

    def __init__(self) -> None:
        self.replicas: list[Any] = []
        self.ready = threading.Event()
        self.failed = False
        self.removed = False
        #: The replica is a running owner's client: the registry never closes it.
        self.owned = False


_lock = threading.Lock()
_table: dict[str, dict[str, _Entry]] = {}


def _close_method(obj: Any) -> Any:
    for attr in ("close", "cleanup"):
        fn = getattr(obj, attr, None)
        if callable(fn):
            return fn
    return None


def _close(obj: Any) -> None:
    fn = _close_method(obj)
    if fn is None:
        return
    if inspect.iscoroutinefunction(fn):
        from toolservices._portal import run_sync

        run_sync(fn)
    else:
        fn()


class LocalServiceRegistry(ServiceRegistry):
    """Services as in-process objects; ``get`` returns the object itself.

    Placement options (Ray's actor options) mean nothing here: ``register``
    takes ``num_replicas`` and Ray's option names out of the keywords and
    ignores the latter, and ``register_with_options`` ignores
    ``actor_options`` other than ``num_replicas``, so the same call works on
    both backends. As on Ray, a constructor parameter named like an option
    needs ``register_with_options``.
    """

    backend = "local"

    def __init__(self, *, namespace: str = DEFAULT_NAMESPACE) -> None:
        super().__init__(namespace=namespace)

    def _split_options(
        self, factory: Any, kwargs: dict[str, Any]
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        names = RAY_PLACEMENT_OPTIONS | {NUM_REPLICAS}
        options = {k: v for k, v in kwargs.items() if k in names}
        if not options:
            return dict(kwargs), {}
        clash = sorted(set(options) & constructor_parameters(factory))
        if clash:
            raise UserError(
                f"{', '.join(map(repr, clash))}: both registry option(s) and parameter(s) of "
                f"{getattr(factory, '__name__', factory)!r}; say which with "
                "register_with_options(name, factory, actor_options={...}, **constructor_kwargs)"
            )
        ctor = {k: v for k, v in kwargs.items() if k not in names}
        return ctor, self._check_options(options)

    def _check_options(self, options: dict[str, Any]) -> dict[str, Any]:
        ignored = sorted(set(options) - {NUM_REPLICAS})
        if ignored:
            _log.debug(
                "local services backend: ignoring placement option(s) %s (they apply to Ray)",
                ", ".join(ignored),
            )
        return {k: v for k, v in options.items() if k == NUM_REPLICAS}

    def _register(
        self,
        name: str,
        factory: Any,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        options: dict[str, Any],
        num_replicas: int,
    ) -> Any:
        if not callable(factory):
            raise UserError(f"Cannot register {factory!r} as service '{name}': it is not callable")
        entry = _Entry()
        with _lock:
            services = _table.setdefault(self.namespace, {})
            if name in services:
                raise exists_error(name, self.namespace)
            services[name] = entry
        built: list[Any] = []
        try:
            for _ in range(num_replicas):
                built.append(factory(*args, **kwargs))
        except BaseException:
            with _lock:
                if _table.get(self.namespace, {}).get(name) is entry:
                    del _table[self.namespace][name]
            entry.failed = True
            entry.ready.set()
            for obj in built:  # the error that matters is the factory's, re-raised below
                try:
                    _close(obj)
                except Exception:
                    _log.warning(
                        "closing a replica of %r during rollback failed", name, exc_info=True
                    )
            raise
        entry.replicas = built
        entry.ready.set()
        return built[0]

    def _register_client(self, name: str, client: Any) -> Any:
        entry = _Entry()
        entry.replicas = [client]
        entry.owned = True
        entry.ready.set()
        with _lock:
            services = _table.setdefault(self.namespace, {})
            if name in services:
                raise exists_error(name, self.namespace)
            services[name] = entry
        return client

    def _entry(self, name: str) -> _Entry:
        with _lock:
            services = _table.get(self.namespace, {})
            entry = services.get(name)
            available = sorted(services)
        if entry is None:
            raise not_found_error(name, self.namespace, available)
        entry.ready.wait()  # a registration in progress in another thread
        if entry.failed:
            raise not_found_error(name, self.namespace, self.list())
        return entry

    def get(self, name: str) -> Any:
        return self._entry(name).replicas[0]

    def get_client(self, name: str) -> Any:
        entry = self._entry(name)
        if not entry.owned:
            raise legacy_registration_error(name, self.namespace)
        return entry.replicas[0]

    def _wait_registered(self, name: str) -> Any:
        return self.get(name)

    def replicas(self, name: str) -> list[Any]:
        return list(self._entry(name).replicas)

    def __contains__(self, name: object) -> bool:
        with _lock:
            return name in _table.get(self.namespace, {})

    def list(self) -> list[str]:
        with _lock:
            return sorted(_table.get(self.namespace, {}))

    def client(self, name: str, *, timeout: float | None = None) -> LocalServiceClient:
        entry = self._entry(name)
        if entry.owned:
            raise owned_service_error(name, self.namespace)
        return LocalServiceClient(name, self.namespace, entry, timeout=timeout)

    def _reset(self) -> CloseFailures:
        with _lock:
            entries = _table.pop(self.namespace, {})
        failures: CloseFailures = []
        for name, entry in sorted(entries.items()):
            entry.removed = True
            entry.ready.wait()
            if entry.owned:
                continue  # its owner keeps running: the registry only forgets the name
            for obj in entry.replicas:
                try:
                    _close(obj)
                except Exception as exc:  # collected and reported by reset(), after the rest
                    failures.append((name, exc))
        return failures


class LocalServiceClient(ServiceClient):
    """Calls the in-process replicas directly; sync methods run in a worker thread for ``acall``.

    ``timeout`` bounds ``acall`` only: a synchronous method running in the
    caller's own thread cannot be interrupted.
    """

    def __init__(self, name: str, namespace: str, entry: _Entry, *, timeout: float | None) -> None:
        super().__init__(name, namespace, replica_names(name, len(entry.replicas)), timeout=timeout)
        self._entry = entry

    def __reduce__(self) -> tuple[Any, ...]:
        raise TypeError(
            f"A client of local service '{self.name}' cannot leave its process: local services "
            "are objects in this process. Use the 'ray' backend to share services across "
            "processes, or get a client from the registry inside the worker."
        )

    def _target(self, index: int) -> Any:
        if self._entry.removed:
            raise ServiceUnavailableError(
                f"Service '{self.name}' in namespace '{self.namespace}' was removed "
                "(reset or shutdown of its registry)",
                retryable=False,
            )
        return self._entry.replicas[index]

    def _method(self, obj: Any, method: str) -> Any:
        fn = getattr(obj, method, None)
        if fn is None or not callable(fn):
            raise AttributeError(f"Service '{self.name}' has no method '{method}'")
        return fn

    def _call(self, index: int, method: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        fn = self._method(self._target(index), method)
        if inspect.iscoroutinefunction(fn):
            from toolservices._portal import run_sync

            return run_sync(functools.partial(fn, *args, **kwargs))
        return fn(*args, **kwargs)

    async def _acall(
        self, index: int, method: str, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Any:
        obj = self._target(index)
        twin = getattr(obj, "a" + method, None)
        fn = twin if inspect.iscoroutinefunction(twin) else self._method(obj, method)
        with anyio.move_on_after(self.timeout) as scope:
            if inspect.iscoroutinefunction(fn):
                return await fn(*args, **kwargs)
            return await anyio.to_thread.run_sync(
                functools.partial(fn, *args, **kwargs), abandon_on_cancel=True
            )
        assert scope.cancelled_caught
        raise ServiceTimeoutError(
            f"Service '{self.name}' did not answer '{method}' within {self.timeout} s",
            retryable=True,
        )
