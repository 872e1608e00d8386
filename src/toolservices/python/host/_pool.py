"""The fork server of a ``PythonExecutorService`` and its spare interpreters.

The server starts on the first call and again when a call finds it dead;
when it exits its sessions are forgotten at once (their next call says its
state was lost). Spare interpreters are forked and warmed ahead of need:
``spares`` on the service's image, and one on each of the ``image_spares``
other images (``SpawnRoot``) sessions were last started on, so that the
2nd..nth session on a task image starts like one on the service's image.
``close`` stops it all; a finalizer is the last resort when nobody did.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import subprocess
import weakref
from collections import OrderedDict
from collections.abc import Callable, Coroutine
from types import ModuleType
from typing import TYPE_CHECKING, Any

import anyio

from toolservices import _portal
from toolservices.errors import InfrastructureError, UserError
from toolservices.python.host._client import ForkServerClient, SessionHandle, SessionLost

if TYPE_CHECKING:
    from toolservices.python.host._sessions import Slot

__all__ = ["IMAGE_SPARES", "SPAWN_WARMUP_TIMEOUT", "ServerPool", "SpawnRoot"]

log = logging.getLogger("toolservices.python.host._service")
#: the time limit of the warm-up call of a new spare interpreter (``warmup``)
SPAWN_WARMUP_TIMEOUT = 10.0
#: how many other images than the service's keep a warm spare (the least recently used
#: image's spare goes first; none at all with ``spares=0``)
IMAGE_SPARES = 4


@dataclasses.dataclass(frozen=True, eq=False)
class SpawnRoot:
    """Another image than the service's for a session's interpreters: the fork server's
    SPAWN ``root`` (its layers, its Env), and what a spare on it runs ahead of need."""

    request: dict[str, Any]
    #: None: the service's ``warmup``
    warmup: str | None = None
    #: roots of equal requests are one image: they share its spare
    key: str = dataclasses.field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "key", json.dumps(self.request, sort_keys=True))


@dataclasses.dataclass(eq=False)
class _ImageSpare:
    root: SpawnRoot
    handle: SessionHandle | None = None


class ServerPool:
    """The fork server, the spares and the background tasks of one service (a base class:
    the service sets the configuration and calls :meth:`_init_pool`)."""

    sandbox: Any
    preload: tuple[str, ...]
    preload_code: str
    max_output: int
    busy_poll: float
    spares: int
    warmup: str
    #: other images than the service's that keep a warm spare (see ``SpawnRoot``)
    image_spares: int = IMAGE_SPARES
    _layers: ModuleType
    _slots: dict[str, Slot]
    _bump: Callable[..., None]

    def _init_pool(self) -> None:
        self._server: ForkServerClient | None = None
        self._starting: anyio.Event | None = None
        self._closed = False
        self._spares: list[SessionHandle] = []
        #: the images sessions were last started on (most recent last), each with its spare
        self._image_spares: OrderedDict[str, _ImageSpare] = OrderedDict()
        self._refilling = False
        self._background: set[asyncio.Task[Any]] = set()
        self._finalizer: weakref.finalize[Any, Any] | None = None
        self._watcher: asyncio.Task[None] | None = None

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
                preload_code=self.preload_code,
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
        for warm in self._image_spares.values():  # the images stay: a new server refills
            if warm.handle is not None:
                warm.handle.abandon()
                warm.handle = None
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

    def _image_to_fill(self) -> _ImageSpare | None:
        """The most recently used image without a spare, if any."""
        for warm in reversed(self._image_spares.values()):
            if warm.handle is None:
                return warm
        return None

    def _schedule_refill(self) -> None:
        if not self._refilling and not self._closed and self._next_spare()[0]:
            self._refilling = True
            self._spawn_background(self._refill())

    def _next_spare(self) -> tuple[bool, _ImageSpare | None]:
        """Which spare to make next: whether one is needed, and on which other image (None:
        the service's). The service image's first while none of them stands, then each
        recently used image's (most recent first), then the rest of the service image's."""
        short = len(self._spares) < self.spares
        if short and not self._spares:
            return True, None
        warm = self._image_to_fill()
        return warm is not None or short, warm

    async def _refill(self) -> None:
        """One spare at a time, in the background (after the call that took one: a spawn and
        its warm-up never compete with that call's start)."""
        warm = None
        try:
            while not self._closed:
                needed, warm = self._next_spare()
                if not needed:
                    return
                server = self._server
                if server is None or not server.alive:
                    return
                root = None if warm is None else warm.root
                spare = await server.spawn(root=None if root is None else root.request)
                # one throw-away call faults in the pages a first call touches
                code = self.warmup if root is None or root.warmup is None else root.warmup
                ran = await spare.run(code, limit=SPAWN_WARMUP_TIMEOUT, fresh=True)
                if self._closed or server is not self._server or not ran.success:
                    await self._discard(spare)
                    self._forget_image(warm, ran.success)
                    return
                if warm is None:
                    self._spares.append(spare)
                elif self._image_spares.get(warm.root.key) is warm and warm.handle is None:
                    warm.handle = spare
                else:  # its image was pushed out meanwhile (or a session took it over)
                    await self._discard(spare)
        except (InfrastructureError, SessionLost) as exc:
            server = self._server
            if not self._closed and server is not None and not server.stopping:
                log.warning("could not prepare a spare Python interpreter: %s", exc)
                self._forget_image(warm, False)
        finally:
            self._refilling = False

    def _forget_image(self, warm: _ImageSpare | None, warmed: bool) -> None:
        """An image whose spare could not be made is not tried again after every call: only
        after its next session (which makes it the most recently used again)."""
        if warm is not None and not warmed and self._image_spares.get(warm.root.key) is warm:
            del self._image_spares[warm.root.key]

    async def _spawn(self, root: SpawnRoot | None = None) -> SessionHandle:
        """A new interpreter (on ``root``'s image: see ``session_roots``); restarts a fork
        server found dead on the way (once)."""
        request = None if root is None else root.request
        server = await self._ensure_started()
        try:
            return await server.spawn(root=request)
        except InfrastructureError:
            if server.alive or self._closed:
                raise
        return await (await self._ensure_started()).spawn(root=request)

    async def _take_spare(self, root: SpawnRoot | None = None) -> SessionHandle:
        """A ready interpreter: a pre-forked spare if there is one, on ``root``'s image (the
        caller orders the next one, ``_schedule_refill``, once its call is done)."""
        if root is None:
            return self._spares.pop() if self._spares else await self._spawn()
        if self.spares == 0 or self.image_spares < 1:
            self._bump("image_spawns")
            return await self._spawn(root)
        warm = self._image_spares.pop(root.key, None)
        if warm is None:
            warm = _ImageSpare(root)
            while len(self._image_spares) >= self.image_spares:  # the least recently used
                _, gone = self._image_spares.popitem(last=False)
                if gone.handle is not None:
                    self._spawn_background(self._discard(gone.handle, wait=False))
        self._image_spares[root.key] = warm  # the most recently used now
        handle, warm.handle = warm.handle, None
        if handle is not None and not handle.dead:
            self._bump("image_spares_taken")
            return handle
        self._bump("image_spawns")
        return await self._spawn(root)

    def _image_spare_count(self) -> int:
        """How many spares stand on other images than the service's (a gauge)."""
        return sum(warm.handle is not None for warm in list(self._image_spares.values()))

    async def _discard(self, handle: SessionHandle, *, wait: bool = True) -> None:
        try:
            await handle.kill(wait=wait)
        except InfrastructureError as exc:  # the server is gone: its sweep took the session
            log.debug("discarding a Python session failed: %s", exc)

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


async def _watch(ref: weakref.ref[ServerPool], server: ForkServerClient) -> None:
    """Wait for the fork server's exit; holds the service weakly, so dropping it frees it."""
    await server.wait_exit()
    service = ref()
    if service is not None:
        await service._on_server_exit(server)
    else:  # dropped without close(): its finalizer stopped the server, the pidfd is ours
        server.release_files()


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
