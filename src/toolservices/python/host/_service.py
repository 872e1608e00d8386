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
from collections.abc import Callable, Coroutine
from types import ModuleType
from typing import Any, TypeVar

import anyio

from toolservices import _portal
from toolservices.errors import UserError
from toolservices.python import sandbox as _sandbox
from toolservices.python.host._args import (
    check_session_id,
    check_timeout,
    image_sandbox,
    pull_image,
)
from toolservices.python.host._client import SessionLost
from toolservices.python.host._result import ExecResult
from toolservices.python.host._sessions import SessionTable, clock
from toolservices.python.host._sizing import default_max_sessions, raise_fd_limit
from toolservices.python.sandbox import check_config, default_config, with_network

__all__ = ["PythonExecutorService"]

T = TypeVar("T")

#: The keyword of ``execute`` / ``aexecute`` by which a service client says it used
#: the session before (services/_ray.py sends it to services with ``toolservices_session_hint``).
SESSION_KNOWN_KWARG = "_session_known"
#: the least default ``max_queue`` (it grows with ``max_sessions``)
DEFAULT_MAX_QUEUE = 4096
#: the default of ``busy_poll``: a warm print(1) round trip is 30-80 us of work
DEFAULT_BUSY_POLL = 500e-6


class PythonExecutorService(SessionTable):
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
    * ``preload_code``: Python source the fork server runs once, after ``preload``,
      before it forks any session: what it leaves in ``sys.modules`` every session
      shares copy-on-write (``ShellService`` installs its supervisor's modules so).
      It must not start threads. Not run for sessions on an ``image`` (they run the
      image's own ``python3``).
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
        preload_code: str = "",
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
        timeout = check_timeout(timeout)
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
        if not isinstance(preload_code, str):
            raise UserError(
                f"preload_code must be a str of Python code, got {type(preload_code).__name__}"
            )
        if not 0 <= busy_poll <= 0.01:
            raise UserError(f"busy_poll must be between 0 and 0.01 seconds, got {busy_poll}")
        self.pool_size = pool_size
        self.timeout = float(timeout)
        self.max_sessions = max_sessions
        self.preload = tuple(preload)
        self.preload_code = preload_code
        self.max_output = max_output
        self.max_queue = max_queue
        self.spares = spares
        self.busy_poll = float(busy_poll)
        self.warmup = warmup
        self._layers: ModuleType = _sandbox
        config = default_config() if sandbox is None else check_config(sandbox)
        self.sandbox = with_network(config, network)
        self.image, self._image_args = pull_image(
            image, image_cache=image_cache, insecure_registries=insecure_registries
        )
        if self.image is not None:
            self.sandbox = image_sandbox(self.sandbox, self.image)
        self._init_pool()
        self._init_sessions(pool_size=pool_size, max_queue=max_queue)

    # --- pickling (Ray and friends rebuild a service from its configuration) ------------

    def __reduce__(self) -> tuple[Callable[..., PythonExecutorService], tuple[Any, ...]]:
        return _rebuild, (type(self), self._config())

    def _config(self) -> dict[str, Any]:
        return {
            "pool_size": self.pool_size,
            "timeout": self.timeout,
            "max_sessions": self._max_sessions_arg,
            "preload": self.preload,
            "preload_code": self.preload_code,
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
            result = self._execute_direct(code, check_session_id(session_id), limit)
            if result is not None:
                return result
        return _portal.run_sync(self._execute, code, session_id, limit, _session_known)

    def has_session(self, session_id: str) -> bool:
        """Whether ``session_id`` is a live session (created and not closed or evicted)."""
        return check_session_id(session_id) in self._slots

    def close_session(self, session_id: str) -> bool:
        """End one session: after a call running in it, kill its process tree, delete its
        working directory. The id can be used again (a fresh session).

        Returns True when a live session was closed, False when there was no such
        session (never created, closed already, evicted, or lost with its fork server).
        """
        return _portal.run_sync(self._close_session, check_session_id(session_id))

    def fork_session(self, src_session_id: str, n: int = 1) -> list[str]:
        """Copy a live session's interpreter into ``n`` new sessions; returns their ids.

        The copies are forks of the source process (its variables, imports and
        objects, without re-running anything), and each gets a copy of the
        files in the source's working directory. The source keeps running
        unchanged. Child processes of the source are not copied.
        """
        return _portal.run_sync(self._fork_session, check_session_id(src_session_id), n)

    def spawn_with_files(self, src_session_id: str, n: int = 1) -> list[str]:
        """``n`` new sessions whose working directory starts as a copy of ``src``'s files.

        Unlike :meth:`fork_session` nothing of the source's memory is copied:
        each is a fresh interpreter with namespaces, disk quota, process
        budget and memory group of its own (it shares nothing with the
        source). No command of the source runs while its files are copied.
        """
        return _portal.run_sync(self._spawn_with_files, check_session_id(src_session_id), n)

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
            "image_spares": self._image_spare_count(),
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
            session_id = check_session_id(session_id)
        return await self._hop(self._execute, code, session_id, limit, _session_known)

    def toolservices_session_hint(self) -> str:
        """The keyword by which service clients say they used a session before."""
        return SESSION_KNOWN_KWARG

    async def aclose_session(self, session_id: str) -> bool:
        """See :meth:`close_session`."""
        return await self._hop(self._close_session, check_session_id(session_id))

    async def afork_session(self, src_session_id: str, n: int = 1) -> list[str]:
        return await self._hop(self._fork_session, check_session_id(src_session_id), n)

    async def aspawn_with_files(self, src_session_id: str, n: int = 1) -> list[str]:
        """See :meth:`spawn_with_files`."""
        return await self._hop(self._spawn_with_files, check_session_id(src_session_id), n)

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

    # --- the core (runs on the shared loop), and the direct route ------------------------

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
            session_id = check_session_id(session_id)
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
        return self.timeout if timeout is None else check_timeout(timeout)

    def _execute_direct(self, code: str, session_id: str, limit: float) -> ExecResult | None:
        """The call from this thread, if its session is live and idle and a slot is free.

        None when the loop must take it: a new session without a spare ready
        (``_new_slot_direct``), a busy, lost or closed one, no free slot, a bad
        argument (the loop path raises the error), or a call from the loop's own
        thread.
        """
        if not isinstance(code, str) or self._closed or _portal.on_loop_thread():
            return None
        slot = self._slots.get(session_id)
        took_spare = slot is None
        if slot is None:
            server = self._server
            if server is None or not server.alive:
                return None
            slot = self._new_slot_direct(session_id)
            if slot is None:
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
            slot.last_used = next(clock)
            spin = self.busy_poll if self._admission.busy == 1 else 0.0
            try:
                result = handle.run_blocking(code, limit=limit, session_id=session_id, spin=spin)
            except SessionLost:  # found broken before running: the loop path restarts it
                return None
            if result.restarted:
                slot.handle = None
        finally:
            self._admission.release(slot.gate)
            if took_spare:  # the next spare, once this call is done (as on the loop route)
                _portal.get_loop().call_soon_threadsafe(self._schedule_refill)
        self._count(result, direct=True)
        return result


def _rebuild(cls: type[PythonExecutorService], config: dict[str, Any]) -> PythonExecutorService:
    return cls(**config)
