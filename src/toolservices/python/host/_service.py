"""``PythonExecutorService``: a pool of forked, sandboxed interpreters.

The core is async and runs on the library's shared event loop
(:mod:`toolservices._portal`); ``execute`` and friends are thin sync faces
over it, and ``aexecute`` from any other loop hops onto it. Scheduling:

* ``pool_size`` execution slots (a :class:`~toolservices.python.host._gate.Gate`) bound the calls
  running at once; sessions are separate interpreters bounded by
  ``max_sessions`` (the least recently used idle one is evicted beyond it);
* a call first takes its session's gate, then a slot, so a slow call never
  holds a slot that a call of another session could use and two calls never
  share an interpreter;
* calls waiting for a session or a slot are counted; beyond ``max_queue``
  the call is refused with :class:`~toolservices.errors.ExecutorBusyError`;
* a sync ``execute`` on an idle live session skips the loop altogether: it
  takes the session's gate and a slot without waiting (both are thread-safe
  :class:`~toolservices.python.host._gate.Gate` objects) and talks to the
  interpreter from the calling thread. On a small VM each thread hand-off
  costs 50-150 us, more than the round trip itself. Anything else (a new
  session, a queue, a failure to clean up after) goes through the loop.
  Both routes are admitted by one :class:`~toolservices.python.host._admission.Admission`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import logging
import math
import subprocess
import threading
import uuid
import weakref
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Coroutine
from types import ModuleType
from typing import TYPE_CHECKING, Any, TypeVar

import anyio

from toolservices import _portal
from toolservices.errors import ExecutorBusyError, InfrastructureError, UserError
from toolservices.python import sandbox as _sandbox
from toolservices.python.host._admission import Admission, Ticket
from toolservices.python.host._client import ForkServerClient, SessionHandle, SessionLost
from toolservices.python.host._forking import fork_handles, seeded_handles
from toolservices.python.host._gate import Gate
from toolservices.python.host._result import ExecResult
from toolservices.python.host._sizing import default_max_sessions, raise_fd_limit
from toolservices.python.sandbox import (
    check_config,
    default_config,
    image_config,
    with_network,
)

if TYPE_CHECKING:
    from toolservices.images import Image

__all__ = ["PythonExecutorService"]

log = logging.getLogger(__name__)
T = TypeVar("T")
#: how many evicted session ids are remembered (to tell their next call its state is gone)
EVICTED_MEMORY = 65536

#: The keyword of ``execute`` / ``aexecute`` by which a service client says it used
#: the session before (services/_ray.py sends it to services with ``toolservices_session_hint``).
SESSION_KNOWN_KWARG = "_session_known"
#: the time limit of the warm-up call of a new spare interpreter (``warmup``)
SPAWN_WARMUP_TIMEOUT = 10.0
#: the least default ``max_queue`` (it grows with ``max_sessions``)
DEFAULT_MAX_QUEUE = 4096
#: the default of ``busy_poll``: a warm print(1) round trip is 30-80 us of work
DEFAULT_BUSY_POLL = 500e-6
_clock = itertools.count(1)  # next() is atomic under the GIL: an LRU stamp from any thread


@dataclasses.dataclass(eq=False)
class _Slot:
    id: str
    gate: Gate = dataclasses.field(default_factory=Gate)  # one call in the interpreter at once
    handle: SessionHandle | None = None
    pending: int = 0  # calls waiting for the gate (loop only): such a slot is not evicted
    lost: bool = False
    closed: bool = False
    last_used: int = 0  # a _clock stamp: the least recently used idle slot is evicted

    def is_open(self) -> bool:
        """Not closed or evicted (checked again once a waiting call holds the gate)."""
        return not self.closed


class PythonExecutorService:
    """Run Python snippets in persistent, isolated sessions or fresh interpreters.

    ``execute(code, session_id=...)`` runs in that session's interpreter
    (variables persist across calls); without a session id the code runs in a
    fresh interpreter that is discarded afterwards. Interpreters are forked
    from a separate fork server that has already imported ``preload``, so a
    new one costs milliseconds. Usable as a plain object (sync or async) and
    as a Ray actor: construction starts nothing; the first call does.

    * ``pool_size``: calls executing at once (TorchRL's meaning); other calls queue.
    * ``timeout``: default wall-clock limit per call, in seconds.
    * ``max_sessions``: live sessions kept; beyond it the least recently used
      idle one is evicted (its next call reports ``restarted``). By default
      (None) as many as half the free memory holds at 3 MiB each (the smaller
      of ``MemAvailable`` and the memory cgroup's room), between 256 and
      16,384; read at construction, so each Ray replica sizes itself from its
      own node (``docs/scaling.md``).
    * ``preload``: modules the fork server imports once (e.g. ``("numpy",)``).
    * ``sandbox``: the isolation settings (``SandboxConfig``); see
      :func:`~toolservices.python.isolation_report`.
    * ``network``: ``"loopback"`` (the default: each session its own network
      namespace with only ``lo`` up), ``"none"`` (no sockets but unix ones) or
      ``"host"`` (the host's network); None keeps ``sandbox.network``
      (``"loopback"`` when ``sandbox`` is None). See docs/sandbox.md.
    * ``image``: a container image reference (``oci:PATH``, ``docker://...``; see
      docs/images.md): every session's root is that image, with a private
      writable layer, and runs the image's own ``python3`` (3.10 or newer), so
      code imports the image's packages. ``image_cache`` and
      ``insecure_registries`` as on ``ShellService``.
    * ``max_output``: bytes kept of stdout and of stderr per call.
    * ``max_queue``: calls allowed to wait; beyond it :class:`ExecutorBusyError`.
      By default 4,096 or ``max_sessions`` if larger: every live session can
      have a call waiting (a whole batch of episodes calling at once).
    * ``spares``: interpreters forked ahead of need, so that a fresh-process
      run or a new session does not wait for a fork.
    * ``warmup``: code each spare runs once, ahead of need (its output is
      dropped): what every session would do first (``ShellService`` loads its
      supervisor and starts a bash there). ``"pass"`` by default.
    * ``busy_poll``: seconds a waiting side polls before it sleeps: the parent
      for a reply when it is the only call executing, an interpreter for its
      next call when calls have been coming back to back. A sleeping process
      takes 50-150 us to wake on a small VM; polling spends at most this much
      CPU per call to skip that. 0 turns it off.
    """

    def __init__(
        self,
        pool_size: int = 32,
        timeout: float = 10.0,
        *,
        max_sessions: int | None = None,
        preload: tuple[str, ...] | list[str] = (),
        sandbox: Any = None,
        max_output: int = 256 * 1024,
        max_queue: int | None = None,
        spares: int = 2,
        busy_poll: float = DEFAULT_BUSY_POLL,
        warmup: str = "pass",
        network: str | None = None,
        image: str | None = None,
        image_cache: str | None = None,
        insecure_registries: tuple[str, ...] | list[str] = (),
    ) -> None:
        if pool_size < 1:
            raise UserError(f"pool_size must be at least 1, got {pool_size}")
        timeout = _check_timeout(timeout)
        self._max_sessions_arg = max_sessions  # None travels as None: a replica sizes itself
        if max_sessions is None:
            max_sessions = default_max_sessions(pool_size=pool_size)
        else:
            raise_fd_limit()  # each live session holds descriptors here
        self._max_queue_arg = max_queue
        if max_queue is None:
            max_queue = max(DEFAULT_MAX_QUEUE, max_sessions)
        if max_sessions < pool_size:
            raise UserError(f"max_sessions ({max_sessions}) must be >= pool_size ({pool_size})")
        if max_output < 1 or max_queue < 1 or spares < 0:
            raise UserError("max_output and max_queue must be positive, spares >= 0")
        if not isinstance(warmup, str):
            raise UserError(f"warmup must be a str of Python code, got {type(warmup).__name__}")
        if not 0 <= busy_poll <= 0.01:
            raise UserError(f"busy_poll must be between 0 and 0.01 seconds, got {busy_poll}")
        self.pool_size = pool_size
        self.timeout = float(timeout)
        self.max_sessions = max_sessions
        self.preload = tuple(preload)
        self.max_output = max_output
        self.max_queue = max_queue
        self.spares = spares
        self.busy_poll = float(busy_poll)
        self.warmup = warmup
        self._layers: ModuleType = _sandbox
        config = default_config() if sandbox is None else check_config(sandbox)
        self.sandbox = with_network(config, network)
        self._image_args = {
            "image": image,
            "image_cache": image_cache,
            "insecure_registries": tuple(insecure_registries),
        }
        self.image: Image | None = None
        if image is not None:
            from toolservices.images import ImageStore  # (urllib and tarfile: only for images)

            self.image = ImageStore(image_cache).pull(
                image, insecure_registries=tuple(insecure_registries)
            )
            self.sandbox = image_sandbox(self.sandbox, self.image)
        self._start_lock = threading.Lock()
        self._server: ForkServerClient | None = None
        self._starting: anyio.Event | None = None
        self._closed = False
        # mutated on the loop only; the direct path reads it from other threads
        self._slots: dict[str, _Slot] = {}
        self._evicted: OrderedDict[str, None] = OrderedDict()
        #: sessions on another image than the service's: id -> the SPAWN request's ``root``
        #: (set before their first call, e.g. by ShellService.start_session); their
        #: interpreters are spawned on it, never taken from the spares
        self.session_roots: dict[str, dict[str, Any]] = {}
        self._spares: list[SessionHandle] = []
        self._refilling = False
        self._admission = Admission(pool_size=pool_size, max_queue=max_queue)
        self._limiter = self._admission.slots  # execution slots
        self._background: set[asyncio.Task[Any]] = set()
        self._stats_lock = threading.Lock()  # counters are bumped from the loop and callers
        self._counters = dict.fromkeys(
            (
                "calls",
                "direct_calls",
                "fresh_calls",
                "timeouts",
                "restarts",
                "evictions",
                "forks",
                "failures",
            ),
            0,
        )
        self._finalizer: weakref.finalize[Any, Any] | None = None
        self._watcher: asyncio.Task[None] | None = None

    # --- pickling (Ray and friends rebuild a service from its configuration) ------------

    def __reduce__(self) -> tuple[Callable[..., PythonExecutorService], tuple[Any, ...]]:
        return _rebuild, (type(self), self._config())

    def _config(self) -> dict[str, Any]:
        return {
            "pool_size": self.pool_size,
            "timeout": self.timeout,
            "max_sessions": self._max_sessions_arg,
            "preload": self.preload,
            # the image travels by name: a replica pulls it into its own node's cache
            "sandbox": dataclasses.replace(self.sandbox, root_layers=(), root_python="")
            if self.image is not None
            else self.sandbox,
            **self._image_args,
            "max_output": self.max_output,
            "max_queue": self._max_queue_arg,
            "spares": self.spares,
            "busy_poll": self.busy_poll,
            "warmup": self.warmup,
        }

    # --- sync faces --------------------------------------------------------------

    def execute(
        self,
        code: str,
        *,
        session_id: str | None = None,
        timeout: float | None = None,
        _session_known: bool = False,
    ) -> ExecResult:
        """Run ``code``; see :meth:`aexecute`."""
        limit = self._call_limit(timeout)
        if session_id is not None:
            result = self._execute_direct(code, _check_session_id(session_id), limit)
            if result is not None:
                return result
        return _portal.run_sync(self._execute, code, session_id, limit, _session_known)

    def has_session(self, session_id: str) -> bool:
        """Whether ``session_id`` is a live session (created and not closed or evicted)."""
        return _check_session_id(session_id) in self._slots

    def close_session(self, session_id: str) -> bool:
        """End one session: after a call running in it, kill its process tree, delete its
        working directory. The id can be used again (a fresh session).

        Returns True when a live session was closed, False when there was no such
        session (never created, closed already, evicted, or lost with its fork server).
        """
        return _portal.run_sync(self._close_session, _check_session_id(session_id))

    def fork_session(self, src_session_id: str, n: int = 1) -> list[str]:
        """Copy a live session's interpreter into ``n`` new sessions; returns their ids.

        The copies are forks of the source process (its variables, imports and
        objects, without re-running anything), and each gets a copy of the
        files in the source's working directory. The source keeps running
        unchanged. Child processes of the source are not copied.
        """
        return _portal.run_sync(self._fork_session, _check_session_id(src_session_id), n)

    def spawn_with_files(self, src_session_id: str, n: int = 1) -> list[str]:
        """``n`` new sessions whose working directory starts as a copy of ``src``'s files.

        Unlike :meth:`fork_session` nothing of the source's memory is copied:
        each is a fresh interpreter with namespaces, disk quota, process
        budget and memory group of its own (it shares nothing with the
        source). No command of the source runs while its files are copied.
        """
        return _portal.run_sync(self._spawn_with_files, _check_session_id(src_session_id), n)

    def isolation_report(self) -> dict[str, Any]:
        """Which isolation layers the sessions get, and why others are missing."""
        if self._server is not None and self._server.report:
            return dict(self._server.report)
        return dict(self._layers.isolation_report(self.sandbox))

    def stats(self) -> dict[str, Any]:
        """Counters and gauges (cheap; safe to call from any thread)."""
        return {
            "sessions": len(self._slots),
            "busy_sessions": self._admission.busy,
            "spares": len(self._spares),
            "queued": self._admission.queued,
            "pool_size": self.pool_size,
            "max_sessions": self.max_sessions,
            **self._counters,
        }

    def close(self) -> None:
        """Kill every session and the fork server; the service cannot be used afterwards."""
        if self._server is None and not self._slots:
            self._closed = True
            return
        _portal.run_sync(self._aclose)

    cleanup = close  # the contract's name

    def __enter__(self) -> PythonExecutorService:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- async faces ----------------------------------------------------------------

    async def aexecute(
        self,
        code: str,
        *,
        session_id: str | None = None,
        timeout: float | None = None,  # noqa: ASYNC109 - the per-call limit, as in execute()
        _session_known: bool = False,
    ) -> ExecResult:
        """Run ``code`` in session ``session_id`` (created on first use) or a fresh interpreter.

        Never raises for what the code does (exceptions, exits, crashes,
        timeouts are in the result); raises :class:`ExecutorBusyError` when the
        queue is full and :class:`InfrastructureError` when the machinery fails.
        ``_session_known`` is set by a service client that has used the session
        before: if this executor does not hold it (a restarted Ray replica, or
        another replica after the session's one died), the call reports
        ``restarted`` instead of looking like a new session.
        """
        limit = self._call_limit(timeout)
        if session_id is not None:
            session_id = _check_session_id(session_id)
        return await self._hop(self._execute, code, session_id, limit, _session_known)

    def toolservices_session_hint(self) -> str:
        """The keyword by which service clients say they used a session before."""
        return SESSION_KNOWN_KWARG

    async def aclose_session(self, session_id: str) -> bool:
        """See :meth:`close_session`."""
        return await self._hop(self._close_session, _check_session_id(session_id))

    async def afork_session(self, src_session_id: str, n: int = 1) -> list[str]:
        return await self._hop(self._fork_session, _check_session_id(src_session_id), n)

    async def aspawn_with_files(self, src_session_id: str, n: int = 1) -> list[str]:
        """See :meth:`spawn_with_files`."""
        return await self._hop(self._spawn_with_files, _check_session_id(src_session_id), n)

    async def aclose(self) -> None:
        await self._hop(self._aclose)

    async def __aenter__(self) -> PythonExecutorService:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    @staticmethod
    async def _hop(fn: Callable[..., Coroutine[Any, Any, T]], *args: Any) -> T:
        """Run ``fn`` on the shared loop, wherever we are called from."""
        home = _portal.get_loop()
        try:
            current: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:  # another async library (trio): go through a worker thread
            current = None
        if current is home:
            return await fn(*args)
        if current is not None:
            return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(fn(*args), home))
        return await anyio.to_thread.run_sync(_portal.run_sync, fn, *args)

    # --- the core (runs on the shared loop) ---------------------------------------------

    async def _ensure_started(self) -> ForkServerClient:
        if self._closed:
            raise UserError("this PythonExecutorService was closed")
        if self._server is not None and self._server.alive:
            return self._server
        if self._starting is not None:
            await self._starting.wait()
            return await self._ensure_started()
        self._starting = anyio.Event()
        try:
            if self._server is not None:  # the old server died: its sessions are gone
                await self._forget_everything()
            server = ForkServerClient(
                layers=self._layers,
                sandbox=self.sandbox,
                preload=self.preload,
                max_output=self.max_output,
                busy_poll=self.busy_poll,
            )
            await server.start()
            failed = server.info.get("preload_failed") or {}
            if failed:
                await server.stop()
                raise UserError(f"cannot preload modules in the Python sessions: {failed}")
            self._server = server
            if self._finalizer is not None:  # the previous server's net, now useless
                self._finalizer.detach()
            self._finalizer = weakref.finalize(self, _last_resort_stop, server)
            self._watcher = asyncio.get_running_loop().create_task(
                _watch(weakref.ref(self), server)
            )
            self._schedule_refill()
        finally:
            self._starting.set()
            self._starting = None
        return server

    async def _forget_everything(self) -> None:
        """After a fork-server loss (or at close): every session is gone.

        Idle sessions are dropped here and their next call says its state was
        lost; a call still running sees its interpreter die and says so itself.
        """
        for slot in list(self._slots.values()):
            if slot.handle is not None and slot.gate.try_acquire():
                slot.handle.abandon()
                slot.handle = None
                slot.lost = True
                slot.gate.release()
        for spare in self._spares:
            spare.abandon()
        self._spares.clear()
        if self._server is not None:
            await self._server.stop()

    async def _on_server_exit(self, server: ForkServerClient) -> None:
        """When the fork server dies, so do its sessions: forget them at once."""
        if server is self._server and not self._closed and not server.stopping:
            log.warning("the Python fork server exited; sessions are restarted on their next call")
            if server.chan is not None:
                server.chan.close()
            await self._forget_everything()

    def _spawn_background(self, coro: Coroutine[Any, Any, Any]) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    def _schedule_refill(self) -> None:
        if not self._refilling and len(self._spares) < self.spares and not self._closed:
            self._refilling = True
            self._spawn_background(self._refill())

    async def _refill(self) -> None:
        try:
            while len(self._spares) < self.spares and not self._closed:
                server = self._server
                if server is None or not server.alive:
                    return
                spare = await server.spawn()
                # one throw-away call faults in the pages a first call touches
                warm = await spare.run(self.warmup, limit=SPAWN_WARMUP_TIMEOUT, fresh=True)
                if self._closed or server is not self._server or not warm.success:
                    await self._discard(spare)
                    return
                self._spares.append(spare)
        except (InfrastructureError, SessionLost) as exc:
            server = self._server
            if not self._closed and server is not None and not server.stopping:
                log.warning("could not prepare a spare Python interpreter: %s", exc)
        finally:
            self._refilling = False

    async def _spawn(self, root: dict[str, Any] | None = None) -> SessionHandle:
        """A new interpreter (on ``root``'s image: see ``session_roots``); restarts a fork
        server found dead on the way (once)."""
        server = await self._ensure_started()
        try:
            return await server.spawn(root=root)
        except InfrastructureError:
            if server.alive or self._closed:
                raise
        return await (await self._ensure_started()).spawn(root=root)

    async def _take_spare(self, root: dict[str, Any] | None = None) -> SessionHandle:
        """A ready interpreter: a pre-forked spare if there is one (and order another)."""
        if root is not None:  # spares stand on the service's image
            return await self._spawn(root)
        return self._spares.pop() if self._spares else await self._spawn()

    async def _discard(self, handle: SessionHandle, *, wait: bool = True) -> None:
        try:
            await handle.kill(wait=wait)
        except InfrastructureError as exc:  # the server is gone: its sweep took the session
            log.debug("discarding a Python session failed: %s", exc)

    async def _execute(
        self,
        code: str,
        session_id: str | None,
        timeout: float | None,  # noqa: ASYNC109 - the caller's per-call limit, checked here
        known: bool = False,
    ) -> ExecResult:
        if not isinstance(code, str):
            raise UserError(f"code must be a str, got {type(code).__name__}")
        limit = self._call_limit(timeout)
        if session_id is not None:
            session_id = _check_session_id(session_id)
        server = await self._ensure_started()
        ticket = self._admission.enter_queue()
        try:
            if session_id is None:
                await self._admission.acquire(None, ticket)
                try:
                    result = await self._run_fresh(server, code, limit)
                finally:
                    self._admission.release(None)
            else:
                result = await self._run_session(session_id, code, limit, ticket, known)
        finally:
            ticket.leave()  # counted once, however the call ended (cancelled, raised)
        self._count(result)
        return result

    def _call_limit(self, timeout: object) -> float:
        return self.timeout if timeout is None else _check_timeout(timeout)

    def _count(self, result: ExecResult, *, direct: bool = False) -> None:
        with self._stats_lock:
            counters = self._counters
            counters["calls"] += 1
            counters["direct_calls"] += direct
            counters["timeouts"] += result.timed_out
            counters["failures"] += not result.success
            counters["restarts"] += result.restarted and result.session_id is not None

    def _bump(self, counter: str, n: int = 1) -> None:
        with self._stats_lock:
            self._counters[counter] += n

    def _execute_direct(self, code: str, session_id: str, limit: float) -> ExecResult | None:
        """The call from this thread, if its session is live and idle and a slot is free.

        None when the loop must take it: a new, busy, lost or closed session,
        no free slot, a bad argument (the loop path raises the error), or a
        call from the loop's own thread.
        """
        slot = self._slots.get(session_id)
        if slot is None or not isinstance(code, str) or self._closed or _portal.on_loop_thread():
            return None

        def usable() -> bool:
            handle, server = slot.handle, self._server
            return not (
                slot.closed
                or slot.lost
                or handle is None
                or handle.dead
                or server is None
                or not server.alive
            )

        if not self._admission.try_acquire(slot.gate, usable):
            return None
        try:
            handle = slot.handle
            assert handle is not None  # usable() said so, and the gate is ours
            slot.last_used = next(_clock)
            spin = self.busy_poll if self._admission.busy == 1 else 0.0
            try:
                result = handle.run_blocking(code, limit=limit, session_id=session_id, spin=spin)
            except SessionLost:  # found broken before running: the loop path restarts it
                return None
            if result.restarted:
                slot.handle = None
        finally:
            self._admission.release(slot.gate)
        self._count(result, direct=True)
        return result

    async def _run_fresh(self, server: ForkServerClient, code: str, limit: float) -> ExecResult:
        self._bump("fresh_calls")
        handle = await self._take_spare()
        try:
            try:
                return await handle.run(code, limit=limit, fresh=True)
            except SessionLost:  # a spare that died while waiting: take a new one
                await self._discard(handle)
                handle = await self._spawn()
                return await handle.run(code, limit=limit, fresh=True)
        finally:
            # clean-up and the next spare after the call, not competing with it for the CPU
            if not handle.dead:
                self._spawn_background(self._discard(handle, wait=False))
            self._schedule_refill()

    def _slot_for(self, session_id: str, known: bool = False) -> _Slot:
        slot = self._slots.get(session_id)
        if slot is not None:
            return slot
        if len(self._slots) >= self.max_sessions:
            self._evict_one()
        # evicted earlier, or used before by the caller (its state was in another
        # process): its next call must say so
        lost = known or session_id in self._evicted
        self._evicted.pop(session_id, None)
        slot = _Slot(session_id, lost=lost)
        self._slots[session_id] = slot
        return slot

    def _evict_one(self) -> None:
        while True:
            idle = [s for s in self._slots.values() if s.pending == 0 and not s.gate.locked()]
            if not idle:
                raise ExecutorBusyError(
                    f"all {self.max_sessions} Python sessions are busy; "
                    "raise max_sessions or retry",
                    retryable=True,
                )
            victim = min(idle, key=lambda s: s.last_used)
            if victim.gate.try_acquire():  # else a direct call took it just now: look again
                break
        del self._slots[victim.id]
        victim.closed = True  # a direct call that takes the gate next sees this
        victim.gate.release()
        self._bump("evictions")
        self._evicted[victim.id] = None
        while len(self._evicted) > EVICTED_MEMORY:
            self.session_roots.pop(self._evicted.popitem(last=False)[0], None)
        if victim.handle is not None:
            self._spawn_background(self._discard(victim.handle))
            victim.handle = None

    async def _run_session(
        self, session_id: str, code: str, limit: float, ticket: Ticket, known: bool = False
    ) -> ExecResult:
        admission = self._admission
        while True:
            slot = self._slot_for(session_id, known)
            slot.pending += 1
            try:
                # closed or evicted while we waited for its gate: look it up again
                if not await admission.acquire(slot.gate, ticket, slot.is_open):
                    continue
                try:
                    slot.last_used = next(_clock)
                    return await self._run_in_slot(slot, code, limit)
                finally:
                    admission.release(slot.gate)
            finally:
                slot.pending -= 1

    async def _run_in_slot(self, slot: _Slot, code: str, limit: float) -> ExecResult:
        # a dead handle still in place was killed under a call that never returned
        # (cancelled, interrupted): that call could not say the state was lost, this one does
        restarted = slot.lost or (slot.handle is not None and slot.handle.dead)
        root = self.session_roots.get(slot.id)
        if slot.handle is None or slot.handle.dead:
            slot.handle = await self._take_spare(root)
        spin = self.busy_poll if self._admission.busy == 1 else 0.0
        try:
            result = await slot.handle.run(
                code, limit=limit, fresh=False, session_id=slot.id, spin=spin
            )
        except SessionLost:
            await self._discard(slot.handle)
            slot.handle = await self._spawn(root)
            restarted = True
            result = await slot.handle.run(
                code, limit=limit, fresh=False, session_id=slot.id, spin=spin
            )
        finally:
            self._schedule_refill()
        slot.lost = False
        if result.restarted:
            slot.handle = None
        if restarted and not result.restarted:  # rare: only then pay for a copy
            result = dataclasses.replace(result, restarted=True)
        return result

    async def _close_session(self, session_id: str) -> bool:
        self._evicted.pop(session_id, None)  # its next use is a new session, not a lost one
        self.session_roots.pop(session_id, None)
        slot = self._slots.pop(session_id, None)
        if slot is None:
            return False
        slot.closed = True
        async with slot.gate:
            if slot.handle is not None:
                await self._discard(slot.handle)
                slot.handle = None
        return True

    async def _fork_session(self, src: str, n: int) -> list[str]:
        if self.image is not None:
            raise UserError(
                "fork_session copies an interpreter's memory; copies of a session on an image "
                "would share its root (they cannot have a writable layer of their own): use "
                "spawn_with_files (a fresh interpreter with a copy of the workspace and of "
                "what the source changed in its root)"
            )
        if getattr(self.sandbox, "own_pids", False):  # copies would die with their source
            raise UserError(
                "fork_session copies an interpreter's memory, which SandboxConfig(own_pids=True) "
                "rules out; use spawn_with_files (files only) or own_pids=False"
            )
        return await self._copy_session(src, n, fork_handles, "fork_session")

    async def _spawn_with_files(self, src: str, n: int) -> list[str]:
        return await self._copy_session(src, n, seeded_handles, "spawn_with_files")

    async def _copy_session(
        self,
        src: str,
        n: int,
        make: Callable[[ForkServerClient, SessionHandle, int], Awaitable[list[SessionHandle]]],
        what: str,
    ) -> list[str]:
        """``n`` new sessions made from ``src`` by ``make`` (forks of it, or fresh sessions
        seeded with its files), under its gate: no call of ``src`` runs meanwhile."""
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise UserError(f"{what} needs n >= 1, got {n!r}")
        server = await self._ensure_started()
        slot = self._slots.get(src)
        if slot is None:
            raise UserError(f"{what}: unknown session {src!r}; create it with execute() first")
        slot.pending += 1
        try:
            async with slot.gate:
                if slot.closed:
                    raise UserError(f"session {src!r} was closed or evicted")
                if slot.handle is None or slot.handle.dead:
                    slot.handle = await self._spawn(self.session_roots.get(src))
                    server = await self._ensure_started()
                for _ in range(n - (self.max_sessions - len(self._slots))):
                    self._evict_one()
                try:
                    handles = await make(server, slot.handle, n)
                except InfrastructureError:
                    if slot.handle.dead:  # killed: its next call must say its state is gone
                        slot.handle = None
                        slot.lost = True
                    raise
        finally:
            slot.pending -= 1
        ids = []
        for handle in handles:
            new = _Slot(f"{src}/{uuid.uuid4().hex[:12]}", handle=handle, lost=slot.lost)
            new.last_used = next(_clock)
            if src in self.session_roots:  # the copy stands on its source's image
                self.session_roots[new.id] = self.session_roots[src]
            self._slots[new.id] = new
            ids.append(new.id)
        self._bump("forks", n)
        return ids

    async def _aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        with anyio.CancelScope(shield=True):
            if self._watcher is not None:
                self._watcher.cancel()
            # spawns and kills in flight finish first (milliseconds), so nothing leaks
            await asyncio.gather(*self._background, return_exceptions=True)
            await self._forget_everything()
            self._slots.clear()
            if self._finalizer is not None:
                self._finalizer.detach()


async def _watch(ref: weakref.ref[PythonExecutorService], server: ForkServerClient) -> None:
    """Wait for the fork server's exit; holds the service weakly, so dropping it frees it."""
    await server.wait_exit()
    service = ref()
    if service is not None:
        await service._on_server_exit(server)
    else:  # dropped without close(): its finalizer stopped the server, the pidfd is ours
        server.release_files()


def _check_timeout(value: object) -> float:
    """A timeout as a float; UserError for anything but a finite number of seconds > 0."""
    number = value if isinstance(value, (int, float)) and not isinstance(value, bool) else None
    if number is not None and math.isfinite(number) and number > 0:
        return float(number)
    raise UserError(
        f"timeout must be a finite number of seconds > 0 (an int or a float), got {value!r}"
    )


def _check_session_id(value: object) -> str:
    """Session ids are non-empty strings: 5 and "5" must not silently share a session."""
    if isinstance(value, str) and value:
        return value
    raise UserError(
        f"session_id must be a non-empty str (or None for a fresh interpreter), got {value!r}"
    )


def image_sandbox(config: Any, image: Image) -> Any:
    """``config`` with ``image`` as every session's root, its ``Env`` and its ``python3``."""
    python = image.which("python3")
    if python is None:
        raise UserError(
            f"image {image.reference!r} has no python3 on its PATH ({image.path}): "
            "PythonExecutorService(image=...) runs the image's own Python; use an image that "
            "has one, or ShellService(image=...) for a shell"
        )
    # as ShellService's sessions: the workspace at one path (/workspace), each session its
    # own PID namespace; spawn_with_files then copies a session's writable layer too
    return dataclasses.replace(
        image_config(config, image),
        root_python=python,
        fixed_workspace=True,
        own_pids=True,
    )


def _rebuild(cls: type[PythonExecutorService], config: dict[str, Any]) -> PythonExecutorService:
    return cls(**config)


def _abandon_sessions(server: ForkServerClient) -> None:
    for handle in list(server.handles):
        handle.abandon()


def _last_resort_stop(server: ForkServerClient) -> None:
    """Safety net (garbage collection or interpreter exit without close()).

    Closing the control socket makes the fork server kill every session and
    delete their directories; the process is then reaped or killed.
    """
    server.stopping = True
    if server.chan is not None:
        server.chan.close()
    # the sessions' channels belong to the loop, which may be using one right now
    loop = _portal.started_loop()
    if loop is not None and not _portal.on_loop_thread():
        loop.call_soon_threadsafe(_abandon_sessions, server)
    else:
        _abandon_sessions(server)
    proc = server.proc
    if proc is not None and proc.poll() is None:
        try:
            proc.wait(timeout=2.0)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=2.0)
    server.close_errlog()  # not the pidfd: the watcher may be awaiting it, and closes it
    if server.plan is not None and hasattr(server.plan, "close"):
        server.plan.close()
