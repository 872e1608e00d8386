"""The fork server of a ``PythonExecutorService`` and its spare interpreters.

The server starts on the first call and again when a call finds it dead;
when it exits its sessions are forgotten at once (their next call says its
state was lost). Spare interpreters are forked and warmed ahead of need.
``close`` stops it all; a finalizer is the last resort when nobody did.
"""

from __future__ import annotations

import asyncio
import logging
import subprocess
import weakref
from collections.abc import Coroutine
from types import ModuleType
from typing import TYPE_CHECKING, Any

import anyio

from toolservices import _portal
from toolservices.errors import InfrastructureError, UserError
from toolservices.python.host._client import ForkServerClient, SessionHandle, SessionLost

if TYPE_CHECKING:
    from toolservices.python.host._sessions import Slot

__all__ = ["SPAWN_WARMUP_TIMEOUT", "ServerPool"]

log = logging.getLogger("toolservices.python.host._service")
#: the time limit of the warm-up call of a new spare interpreter (``warmup``)
SPAWN_WARMUP_TIMEOUT = 10.0


class ServerPool:
    """The fork server, the spares and the background tasks of one service (a base class:
    the service sets the configuration and calls :meth:`_init_pool`)."""

    sandbox: Any
    preload: tuple[str, ...]
    max_output: int
    busy_poll: float
    spares: int
    warmup: str
    _layers: ModuleType
    _slots: dict[str, Slot]

    def _init_pool(self) -> None:
        self._server: ForkServerClient | None = None
        self._starting: anyio.Event | None = None
        self._closed = False
        self._spares: list[SessionHandle] = []
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
