"""The Ray backend: every service is a named, detached actor in a Ray namespace.

Ray's named-actor table is the only state. ``get`` / ``in`` are one lookup in
it, ``list`` is one listing, and registration relies on Ray refusing a second
actor with a taken name, so two workers racing end with one service and one
"already exists" error. A service with ``k`` replicas is ``k`` actors:
replica 0 under the plain name, replica ``i`` under ``name#replica<i>of<k>``.
Replica 0 is created *last*, so whoever can see the name can see all of its
replicas, and a failed registration never shows up in ``list()``.

A running :class:`~toolservices.services.Service` owner is shared through a
small record actor under its name (no CPU reserved) that holds the owner's
picklable client: peers in any worker get the client from it, and the owner
itself stays where it runs.
"""

from __future__ import annotations

import asyncio
import functools
import importlib
import inspect
import re
import threading
from collections import OrderedDict
from collections.abc import Hashable, Mapping
from typing import Any

import anyio
import anyio.to_thread

from toolservices.errors import (
    InfrastructureError,
    ServiceTimeoutError,
    ServiceUnavailableError,
    UserError,
)
from toolservices.services.base import (
    DEFAULT_NAMESPACE,
    NUM_REPLICAS,
    REPLICA_SEPARATOR,
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

__all__ = ["RayServiceClient", "RayServiceRegistry", "ray_actor_option_names"]

#: Set by the registry itself on every actor it creates.
_RESERVED_OPTIONS = frozenset({"name", "namespace", "get_if_exists"})

#: How long ``reset`` lets each service run its ``close()`` before killing it.
CLOSE_TIMEOUT = 10.0

#: How long ``reset`` waits for an actor without a worker process yet to get one; one
#: that still has none is killed without close() (its constructor never ran).
STARTUP_GRACE = 3.0

#: How long ``reset`` waits for actors to exit on their own before killing them.
TERMINATE_GRACE = 5.0

#: How long ``get_or_register`` waits for another worker's registration to finish.
REGISTRATION_WAIT = 60.0

_REPLICA_RE = re.compile(re.escape(REPLICA_SEPARATOR) + r"(\d+)of(\d+)$")

#: States of Ray's actor table for an actor whose constructor has not run yet.
_NOT_STARTED_STATES = frozenset({"DEPENDENCIES_UNREADY", "PENDING_CREATION"})

#: The method by which a record actor of a Service owner is recognised.
_CLIENT_METHOD = "toolservices_owned_client"

#: A service with this method (the Python executor) accepts ``_session_known=True``
#: on ``execute`` / ``aexecute`` from a client that used the session before, and
#: reports ``restarted`` if it does not hold that session (its replica restarted).
_SESSION_HINT_METHOD = "toolservices_session_hint"
_SESSION_KNOWN = "_session_known"
_HINTED_METHODS = frozenset({"execute", "aexecute"})
_CLOSING_METHODS = frozenset({"close_session", "aclose_session"})

#: How many session ids a client remembers having used (least recently used dropped).
SESSIONS_REMEMBERED = 65536


class _ClientRecord:
    """Holds the client of a Service owner so that every worker can fetch it."""

    def __init__(self, client: Any) -> None:
        self._client = client

    def toolservices_owned_client(self) -> Any:
        return self._client


def _async_facade(cls: type) -> type:
    """An actor class serving ``cls``'s sync methods by their async twins.

    A class with async methods becomes an *async* Ray actor, and Ray runs its
    sync methods on the actor's event loop: a blocking ``execute`` called
    through the raw handle (``handle.execute.remote(...)``, the TorchRL way)
    would hold up every other caller. The facade holds the real service and
    answers ``execute`` with ``aexecute``, so the handle keeps its interface
    and calls overlap. It wraps rather than subclasses, so the service's own
    internal calls (an ``aexecute`` that calls ``self.execute``) are untouched.
    """
    members = {
        attr: getattr(cls, attr)
        for attr in dir(cls)
        if not attr.startswith("_") and callable(getattr(cls, attr, None))
    }
    twins = {
        attr
        for attr, member in members.items()
        if not inspect.iscoroutinefunction(member)
        and inspect.iscoroutinefunction(members.get("a" + attr))
    }
    if not twins:
        return cls

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        self._service = cls(*args, **kwargs)

    namespace: dict[str, Any] = {
        "__init__": functools.wraps(_own_init(cls))(__init__),
        "__module__": cls.__module__,
        "__qualname__": cls.__qualname__,
        "__doc__": cls.__doc__,
    }
    for attr, member in members.items():
        target = "a" + attr if attr in twins else attr
        namespace[attr] = _forward(
            target, member, asynchronous=target != attr or (inspect.iscoroutinefunction(member))
        )
    return type(cls.__name__, (), namespace)


def _own_init(cls: type) -> Any:
    """The ``__init__`` that constructing ``cls`` runs (for its signature)."""
    return next(vars(klass)["__init__"] for klass in cls.__mro__ if "__init__" in vars(klass))


def _forward(target: str, member: Any, *, asynchronous: bool) -> Any:
    if asynchronous:

        async def forward_async(self: Any, *args: Any, **kwargs: Any) -> Any:
            return await getattr(self._service, target)(*args, **kwargs)

        return functools.wraps(member)(forward_async)

    def forward(self: Any, *args: Any, **kwargs: Any) -> Any:
        return getattr(self._service, target)(*args, **kwargs)

    return functools.wraps(member)(forward)


def _import_ray() -> Any:
    try:
        return importlib.import_module("ray")
    except ImportError as exc:
        raise UserError(
            "The 'ray' services backend needs Ray: pip install 'toolservices[ray]'"
        ) from exc


@functools.lru_cache(maxsize=1)
def ray_actor_option_names() -> frozenset[str]:
    """The option names that Ray's ``ActorClass.options()`` accepts, read from Ray itself."""
    _import_ray()
    for module in ("ray._common.ray_option_utils", "ray._private.ray_option_utils"):
        try:
            table = importlib.import_module(module).actor_options
        except (ImportError, AttributeError):
            continue
        return frozenset(table)
    raise InfrastructureError("Cannot find Ray's table of actor options in this Ray version")


def _already_exists(exc: BaseException) -> bool:
    ray = _import_ray()
    kind = getattr(ray.exceptions, "ActorAlreadyExistsError", None)
    if kind is not None:
        return isinstance(exc, kind)
    return isinstance(exc, ValueError) and "already taken" in str(exc)  # Ray < 2.4x


class RayServiceRegistry(ServiceRegistry):
    """Services as named, detached Ray actors; ``get`` returns the actor handle.

    ``ray_init_config`` goes to ``ray.init`` only when Ray is not running yet
    (inside a Ray worker it already is). ``shutdown()`` terminates this
    namespace's services, never the Ray cluster.
    """

    backend = "ray"

    def __init__(
        self,
        *,
        namespace: str = DEFAULT_NAMESPACE,
        ray_init_config: Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__(namespace=namespace)
        ray = _import_ray()
        if not ray.is_initialized():
            ray.init(**dict(ray_init_config or {}))
        self._ray = ray

    def __getstate__(self) -> dict[str, Any]:
        return {"namespace": self.namespace}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.namespace = state["namespace"]
        self._ray = _import_ray()  # unpickled inside a Ray worker, where Ray is running

    # -- options ---------------------------------------------------------------------

    def _split_options(
        self, factory: Any, kwargs: dict[str, Any]
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        names = ray_actor_option_names() | {NUM_REPLICAS}
        options = {k: v for k, v in kwargs.items() if k in names}
        ctor = {k: v for k, v in kwargs.items() if k not in names}
        clash = sorted(set(options) & constructor_parameters(factory))
        if clash:
            raise UserError(
                f"{', '.join(map(repr, clash))}: both Ray actor option(s) and parameter(s) of "
                f"{getattr(factory, '__name__', factory)!r}; say which with "
                "register_with_options(name, factory, actor_options={...}, **constructor_kwargs)"
            )
        return ctor, self._check_options(options)

    def _check_options(self, options: dict[str, Any]) -> dict[str, Any]:
        valid = ray_actor_option_names() - _RESERVED_OPTIONS
        reserved = sorted(set(options) & _RESERVED_OPTIONS)
        if reserved:
            raise UserError(
                f"Actor option(s) {', '.join(reserved)} are set by the registry "
                "(service name and namespace)"
            )
        unknown = sorted(set(options) - valid - {NUM_REPLICAS})
        if unknown:
            raise UserError(
                f"Unknown Ray actor option(s) {', '.join(unknown)}. "
                f"Valid options: {NUM_REPLICAS}, {', '.join(sorted(valid))}"
            )
        return options

    def _actor_class(self, name: str, factory: Any) -> Any:
        if isinstance(factory, self._ray.actor.ActorClass):
            return factory
        if inspect.isclass(factory):
            return self._ray.remote(_async_facade(factory))
        raise UserError(
            f"Cannot register {factory!r} as Ray service '{name}': the Ray backend creates "
            "actors from classes (or @ray.remote classes)"
        )

    # -- registration ----------------------------------------------------------------------

    def _register(
        self,
        name: str,
        factory: Any,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        options: dict[str, Any],
        num_replicas: int,
    ) -> Any:
        actor_class = self._actor_class(name, factory)
        opts = {"lifetime": "detached", **options}
        if num_replicas > 1:
            opts.setdefault("scheduling_strategy", "SPREAD")
        names = replica_names(name, num_replicas)[1:]
        created: list[Any] = []
        try:
            for actor_name in [*names, name]:  # the plain name last: it commits the service
                handle = actor_class.options(
                    name=actor_name, namespace=self.namespace, **opts
                ).remote(*args, **kwargs)
                created.append(handle)
        except BaseException as exc:
            for handle in created:
                self._ray.kill(handle, no_restart=True)
            if _already_exists(exc):
                raise exists_error(name, self.namespace) from exc
            raise
        return created[-1]

    def _register_client(self, name: str, client: Any) -> Any:
        ray = self._ray
        record = ray.remote(_ClientRecord).options(
            name=name, namespace=self.namespace, lifetime="detached", num_cpus=0
        )
        try:
            handle = record.remote(client)
        except Exception as exc:
            if _already_exists(exc):
                raise exists_error(name, self.namespace) from exc
            raise UserError(
                f"Cannot share the client of Service '{name}' over Ray: it must be picklable "
                f"({type(client).__name__}: {exc})"
            ) from exc
        # Wait until peers can read it: a client that cannot be rebuilt in a Ray
        # worker (its class not importable there) fails here, not in a peer's get().
        try:
            ray.get(handle.__ray_ready__.remote(), timeout=REGISTRATION_WAIT)
        except Exception as exc:
            ray.kill(handle, no_restart=True)
            raise UserError(
                f"Cannot share the client of Service '{name}' over Ray: its record actor did "
                f"not start ({type(exc).__name__}: {exc}); the client's class must be "
                "importable in Ray workers"
            ) from exc
        return client

    def _owned_client(self, name: str, handle: Any) -> Any:
        ray = self._ray
        try:
            return ray.get(getattr(handle, _CLIENT_METHOD).remote(), timeout=REGISTRATION_WAIT)
        except ray.exceptions.RayActorError as exc:
            raise ServiceUnavailableError(
                f"Service '{name}' in namespace '{self.namespace}': the record of its client "
                f"is gone ({type(exc).__name__}); register the owner again",
                retryable=False,
            ) from exc
        except ray.exceptions.GetTimeoutError:
            raise ServiceTimeoutError(
                f"Service '{name}' in namespace '{self.namespace}': its client record did not "
                f"answer within {REGISTRATION_WAIT} s",
                retryable=True,
            ) from None

    def _wait_registered(self, name: str) -> Any:
        try:
            return self.get(name)
        except KeyError:
            pending = self._replica_actor_names(name)
            if not pending:
                raise
        # Another worker created the replicas and is about to create the plain name;
        # its replica becoming ready bounds how long that takes.
        ray = self._ray
        try:
            handle = ray.get_actor(pending[0], namespace=self.namespace)
            ray.get(handle.__ray_ready__.remote(), timeout=REGISTRATION_WAIT)
        except ray.exceptions.GetTimeoutError:
            raise ServiceTimeoutError(
                f"Service '{name}' in namespace '{self.namespace}' is being registered by "
                f"another worker and was not ready within {REGISTRATION_WAIT} s",
                retryable=True,
            ) from None
        except (ValueError, ray.exceptions.RayActorError):
            pass  # that registration failed and rolled back: get() reports "not found"
        return self.get(name)

    # -- lookup ------------------------------------------------------------------------------

    def _named_actors(self) -> list[str]:
        return [
            entry["name"]
            for entry in self._ray.util.list_named_actors(all_namespaces=True)
            if entry["namespace"] == self.namespace
        ]

    def _replica_actor_names(self, name: str) -> list[str]:
        """Names of replicas 1.. of ``name`` that are registered, in replica order."""
        found = []
        for actor_name in self._named_actors():
            rest = actor_name[len(name) :] if actor_name.startswith(name) else ""
            match = _REPLICA_RE.fullmatch(rest)
            if match:
                found.append((int(match.group(1)), actor_name))
        return [actor_name for _, actor_name in sorted(found)]

    def _head(self, name: str) -> Any:
        """The actor under the plain name (a service's replica 0 or an owner's record)."""
        if isinstance(name, str) and "#" not in name:
            try:
                return self._ray.get_actor(name, namespace=self.namespace)
            except ValueError:
                pass  # not registered: reported below with the list of services
        raise not_found_error(name, self.namespace, self.list())

    def get(self, name: str) -> Any:
        head = self._head(name)
        if hasattr(head, _CLIENT_METHOD):
            return self._owned_client(name, head)
        return head

    def get_client(self, name: str) -> Any:
        head = self._head(name)
        if not hasattr(head, _CLIENT_METHOD):
            raise legacy_registration_error(name, self.namespace)
        return self._owned_client(name, head)

    def replicas(self, name: str) -> list[Any]:
        head = self.get(name)
        rest = [
            self._ray.get_actor(actor_name, namespace=self.namespace)
            for actor_name in self._replica_actor_names(name)
        ]
        return [head, *rest]

    def __contains__(self, name: object) -> bool:
        if not isinstance(name, str) or "#" in name:
            return False
        try:
            self._ray.get_actor(name, namespace=self.namespace)
        except ValueError:
            return False
        return True

    def list(self) -> list[str]:
        return sorted(n for n in self._named_actors() if "#" not in n)

    def client(self, name: str, *, timeout: float | None = None) -> RayServiceClient:
        head = self._head(name)
        if hasattr(head, _CLIENT_METHOD):
            raise owned_service_error(name, self.namespace)
        names = [name, *self._replica_actor_names(name)]
        return RayServiceClient(name, self.namespace, names, head, timeout=timeout)

    # -- teardown ------------------------------------------------------------------------------

    _close_failure_suffix = " (their actors were killed anyway)"

    def _unplaced(self, handles: Mapping[str, Any]) -> set[str]:
        """Actors that no worker process has taken yet (their constructor has not run).

        Read from Ray's actor table (``ray.state``): state still pending and
        no worker pid. If this Ray does not offer the table, every actor
        counts as placed.
        """
        table = getattr(getattr(self._ray, "state", None), "actors", None)
        if table is None:
            return set()
        unplaced = set()
        for actor_name, handle in handles.items():
            try:
                entry = table(handle._actor_id.hex())
            except Exception:  # best effort: an unknown state means "close it normally"
                continue
            if entry.get("State") in _NOT_STARTED_STATES and not entry.get("Pid"):
                unplaced.add(actor_name)
        return unplaced

    def _never_started(self, handles: Mapping[str, Any]) -> set[str]:
        """Actors that did not start within ``STARTUP_GRACE`` (e.g. more CPUs asked than
        the cluster has): no constructor ran, so there is nothing to close, and a
        close() sent to them would only wait for a start that may never come."""
        unplaced = self._unplaced(handles)
        if not unplaced:
            return set()
        ready = {handles[name].__ray_ready__.remote(): name for name in unplaced}
        done, _ = self._ray.wait(list(ready), num_returns=len(ready), timeout=STARTUP_GRACE)
        waiting = {name: handles[name] for name in unplaced - {ready[ref] for ref in done}}
        return self._unplaced(waiting)

    def _reset(self) -> CloseFailures:
        ray = self._ray
        handles: dict[str, Any] = {}
        for actor_name in self._named_actors():
            try:
                handles[actor_name] = ray.get_actor(actor_name, namespace=self.namespace)
            except ValueError:
                continue  # died since it was listed
        never_started = self._never_started(handles)
        started = {name: h for name, h in handles.items() if name not in never_started}
        closing: dict[Any, str] = {}
        for actor_name, handle in started.items():
            for method in ("close", "cleanup"):
                if hasattr(handle, method):
                    closing[getattr(handle, method).remote()] = actor_name
                    break
        failures: CloseFailures = []
        if closing:
            done, late = ray.wait(list(closing), num_returns=len(closing), timeout=CLOSE_TIMEOUT)
            for ref in done:
                try:
                    ray.get(ref)
                except ray.exceptions.RayActorError:
                    continue  # already gone: nothing left to close
                except Exception as exc:  # collected, reported after every actor is killed
                    failures.append((closing[ref], exc))
            for ref in late:
                failures.append(
                    (closing[ref], TimeoutError(f"close() took over {CLOSE_TIMEOUT} s"))
                )
        # Ask each actor to exit after the calls it has already accepted, then kill
        # whatever is still there: once reset() returns no call can reach an old actor.
        exiting = [handle.__ray_terminate__.remote() for handle in started.values()]
        if exiting:
            ray.wait(exiting, num_returns=len(exiting), timeout=TERMINATE_GRACE)
        for handle in handles.values():
            ray.kill(handle, no_restart=True)
        return failures


class RayServiceClient(ServiceClient):
    """Calls actor methods: ``ray.get`` with the client's timeout in sync code,
    ``await`` on the ObjectRef in asyncio code.

    If the class defines an ``a``-prefixed twin of a method (``execute`` /
    ``aexecute``), both ``call`` and ``acall`` use the twin: in an async actor
    a synchronous method would block the actor's event loop for everyone.

    The client remembers the sessions it ran code in; calling the Python
    executor again for one of them it says so, and a replica that does not
    hold the session (Ray restarted it, or the session's replica died and it
    moved) answers ``restarted`` rather than running it as a new session.
    Only this client's own sessions are covered: a copy shipped to another
    worker, or another client, starts knowing none.
    """

    def __init__(
        self, name: str, namespace: str, names: list[str], head: Any, *, timeout: float | None
    ) -> None:
        super().__init__(name, namespace, names, timeout=timeout)
        self._ray = _import_ray()
        self._handles: list[Any] = [head] + [None] * (len(names) - 1)
        self._methods: dict[str, str] = {}
        self._hinted: dict[str, bool] = {}  # method -> passes the session-known hint
        self._used: OrderedDict[Hashable, None] = OrderedDict()
        self._used_lock = threading.Lock()

    def __reduce__(self) -> tuple[Any, ...]:
        """Ship the client to other workers (a transform pickled into a collector).

        The copy starts with fresh load counts and re-learns dead replicas.
        """
        return (
            _rebuild_client,
            (self.name, self.namespace, list(self._router.replicas), self._handles, self.timeout),
        )

    def _handle(self, index: int) -> Any:
        handle = self._handles[index]
        if handle is None:
            actor_name = self._router.replicas[index]
            try:
                handle = self._ray.get_actor(actor_name, namespace=self.namespace)
            except ValueError:
                raise self._gone(index, "it is no longer registered") from None
            self._handles[index] = handle
        return handle

    def _submit(
        self, index: int, method: str, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Any:
        handle = self._handle(index)
        actual = self._methods.get(method)
        if actual is None:
            twin = "a" + method
            if hasattr(handle, twin):
                actual = twin
            elif hasattr(handle, method):
                actual = method
            else:
                raise AttributeError(f"Service '{self.name}' has no method '{method}'")
            self._methods[method] = actual
            self._hinted[method] = actual in _HINTED_METHODS and hasattr(
                handle, _SESSION_HINT_METHOD
            )
        session_id = kwargs.get("session_id")
        if session_id is not None and self._hinted[method]:
            with self._used_lock:
                if session_id in self._used:
                    kwargs = {**kwargs, _SESSION_KNOWN: True}
        elif actual in _CLOSING_METHODS:
            closed = args[0] if args else session_id
            with self._used_lock:
                self._used.pop(closed, None)
        return getattr(handle, actual).remote(*args, **kwargs)

    def _served(self, method: str, kwargs: dict[str, Any]) -> None:
        """Remember a session that a call ran in (after it came back)."""
        session_id = kwargs.get("session_id")
        if session_id is None or not self._hinted.get(method):
            return
        with self._used_lock:
            self._used[session_id] = None
            self._used.move_to_end(session_id)
            while len(self._used) > SESSIONS_REMEMBERED:
                self._used.popitem(last=False)

    def _call(self, index: int, method: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        ray = self._ray
        ref = self._submit(index, method, args, kwargs)
        try:
            result = ray.get(ref, timeout=self.timeout)
            self._served(method, kwargs)
            return result
        except ray.exceptions.GetTimeoutError:
            ray.cancel(ref)
            raise self._timeout(method) from None
        except ray.exceptions.RayActorError as exc:
            raise self._unavailable(index, exc) from exc

    async def _acall(
        self, index: int, method: str, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Any:
        ray = self._ray
        ref = self._submit(index, method, args, kwargs)
        try:
            asyncio.get_running_loop()
            on_asyncio = True
        except RuntimeError:  # trio: wait for the result in a worker thread
            on_asyncio = False
        try:
            with anyio.move_on_after(self.timeout):
                if on_asyncio:
                    result = await ref
                else:
                    result = await anyio.to_thread.run_sync(
                        functools.partial(ray.get, ref), abandon_on_cancel=True
                    )
                self._served(method, kwargs)
                return result
        except ray.exceptions.RayActorError as exc:
            raise self._unavailable(index, exc) from exc
        ray.cancel(ref)
        raise self._timeout(method)

    def _timeout(self, method: str) -> ServiceTimeoutError:
        return ServiceTimeoutError(
            f"Service '{self.name}' in namespace '{self.namespace}' did not answer "
            f"'{method}' within {self.timeout} s; the call was cancelled",
            retryable=True,
        )

    def _where(self, index: int) -> str:
        where = f"Service '{self.name}'"
        if self.num_replicas > 1:
            where += f" (replica {index} of {self.num_replicas})"
        return f"{where} in namespace '{self.namespace}'"

    def _unavailable(self, index: int, exc: BaseException) -> ServiceUnavailableError:
        restarting = getattr(self._ray.exceptions, "ActorUnavailableError", None)
        if restarting is not None and isinstance(exc, restarting):
            return ServiceUnavailableError(
                f"{self._where(index)} is unavailable: its Ray actor is restarting or "
                "unreachable; retry (state held by the actor is lost if it restarted)",
                retryable=True,
            )
        return self._gone(index, f"its Ray actor died ({type(exc).__name__})")

    def _gone(self, index: int, why: str) -> ServiceUnavailableError:
        self._handles[index] = None
        if self.num_replicas == 1:
            return ServiceUnavailableError(
                f"{self._where(index)} is unavailable: {why} and will not come back; "
                "register it again",
                retryable=False,
            )
        self._router.mark_dead(index)
        live = bool(self._router.live())
        return ServiceUnavailableError(
            f"{self._where(index)} is unavailable: {why}. "
            + (
                "Later calls go to the remaining replicas; sessions it held are lost."
                if live
                else "No replica is left; register the service again."
            ),
            retryable=live,
        )


def _rebuild_client(
    name: str, namespace: str, names: list[str], handles: list[Any], timeout: float | None
) -> RayServiceClient:
    head = handles[0]
    client = RayServiceClient(name, namespace, names, head, timeout=timeout)
    client._handles = list(handles)
    return client
