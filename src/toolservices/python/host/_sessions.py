"""Where a ``PythonExecutorService`` call runs: a session's interpreter, or a fresh one.

The session table: one :class:`Slot` per live session (its gate lets one
call in at a time), the least recently used idle one evicted beyond
``max_sessions``, evicted ids remembered so that their next call says its
state was lost; closing a session, and copying one (forks of its
interpreter, or fresh sessions seeded with its files). Runs on the shared
loop, except what the direct route of a sync ``execute`` reads.
"""

from __future__ import annotations

import dataclasses
import itertools
import threading
import uuid
from collections import OrderedDict
from collections.abc import Awaitable, Callable

from toolservices.errors import ExecutorBusyError, InfrastructureError, UserError
from toolservices.python.host._admission import Admission, Ticket
from toolservices.python.host._client import ForkServerClient, SessionHandle, SessionLost
from toolservices.python.host._forking import fork_handles, seeded_handles
from toolservices.python.host._gate import Gate
from toolservices.python.host._pool import ServerPool, SpawnRoot
from toolservices.python.host._result import ExecResult

__all__ = ["EVICTED_MEMORY", "SessionTable", "Slot", "clock"]

#: how many evicted session ids are remembered (to tell their next call its state is gone)
EVICTED_MEMORY = 65536
clock = itertools.count(1)  # next() is atomic under the GIL: an LRU stamp from any thread


@dataclasses.dataclass(eq=False)
class Slot:
    id: str
    gate: Gate = dataclasses.field(default_factory=Gate)  # one call in the interpreter at once
    handle: SessionHandle | None = None
    pending: int = 0  # calls waiting for the gate (loop only): such a slot is not evicted
    lost: bool = False
    closed: bool = False
    last_used: int = 0  # a clock stamp: the least recently used idle slot is evicted

    def is_open(self) -> bool:
        """Not closed or evicted (checked again once a waiting call holds the gate)."""
        return not self.closed


class SessionTable(ServerPool):
    """The sessions of one service, its admission and its counters (a base class: the
    service sets the configuration and calls :meth:`_init_sessions`)."""

    max_sessions: int
    image: object

    def _init_sessions(self, *, pool_size: int, max_queue: int) -> None:
        # mutated on the loop only; the direct path reads it from other threads
        self._slots: dict[str, Slot] = {}
        self._evicted: OrderedDict[str, None] = OrderedDict()
        #: sessions on another image than the service's: id -> its root (set before their
        #: first call, e.g. by ShellService.start_session); their interpreters are spawned
        #: on it, or taken from the spare kept on it (see ``image_spares``)
        self.session_roots: dict[str, SpawnRoot] = {}
        self._admission = Admission(pool_size=pool_size, max_queue=max_queue)
        self._limiter = self._admission.slots  # execution slots
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
                # a session's interpreter on another image: its image's spare, or a new one
                "image_spares_taken",
                "image_spawns",
            ),
            0,
        )

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

    def _slot_for(self, session_id: str, known: bool = False) -> Slot:
        slot = self._slots.get(session_id)
        if slot is not None:
            return slot
        if len(self._slots) >= self.max_sessions:
            self._evict_one()
        # evicted earlier, or used before by the caller (its state was in another
        # process): its next call must say so
        lost = known or session_id in self._evicted
        self._evicted.pop(session_id, None)
        # setdefault: a caller's thread may have made it meanwhile (``_new_slot_direct``)
        return self._slots.setdefault(session_id, Slot(session_id, lost=lost))

    def _new_slot_direct(self, session_id: str) -> Slot | None:
        """A new session's slot holding a ready spare, made in the caller's thread (its first
        call then skips the hops to the loop and back, about 0.8 ms on a small VM); None when
        the loop must make it: no spare ready, the table full, news of an evicted session, a
        session on another image."""
        if (
            session_id in self._evicted
            or session_id in self.session_roots
            or len(self._slots) >= self.max_sessions
        ):
            return None
        try:
            spare = self._spares.pop()  # atomic: the loop's refill appends, its spawns pop
        except IndexError:
            return None
        slot = Slot(session_id, handle=spare)
        if self._slots.setdefault(session_id, slot) is not slot:  # the loop made it first
            self._spares.append(spare)
            return None
        return slot  # the caller orders the next spare once its call is done

    def _evict_one(self) -> None:
        while True:
            slots = list(self._slots.values())  # one step: a caller's thread may add one
            idle = [s for s in slots if s.pending == 0 and not s.gate.locked()]
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
                    slot.last_used = next(clock)
                    return await self._run_in_slot(slot, code, limit)
                finally:
                    admission.release(slot.gate)
            finally:
                slot.pending -= 1

    async def _run_in_slot(self, slot: Slot, code: str, limit: float) -> ExecResult:
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
            new = Slot(f"{src}/{uuid.uuid4().hex[:12]}", handle=handle, lost=slot.lost)
            new.last_used = next(clock)
            if src in self.session_roots:  # the copy stands on its source's image
                self.session_roots[new.id] = self.session_roots[src]
            self._slots[new.id] = new
            ids.append(new.id)
        self._bump("forks", n)
        return ids
