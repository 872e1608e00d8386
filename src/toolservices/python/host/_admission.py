"""How a call is admitted: the queue count, its session's gate, an execution slot.

Both routes of ``PythonExecutorService`` go through one :class:`Admission`:
the loop route waits (:meth:`Admission.acquire`), the direct route of a sync
``execute`` on an idle session takes the same gates without waiting, from the
caller's thread (:meth:`Admission.try_acquire`), and hands the call to the
loop route when it cannot. The order is the same on both: the session's gate
first, then a slot, so a slow call never holds a slot that a call of another
session could use and two calls never share an interpreter.
"""

from __future__ import annotations

from collections.abc import Callable

from toolservices.errors import ExecutorBusyError
from toolservices.python.host._gate import Gate

__all__ = ["Admission", "Ticket"]


def _always() -> bool:
    return True


class Ticket:
    """One call's place in the queue count: leaves it at most once, however the call ends."""

    __slots__ = ("admission", "waiting")

    def __init__(self, admission: Admission) -> None:
        self.admission = admission
        self.waiting = True

    def leave(self) -> None:
        if self.waiting:
            self.waiting = False
            self.admission.queued -= 1


class Admission:
    """``pool_size`` execution slots and the count of calls waiting, up to ``max_queue``."""

    def __init__(self, *, pool_size: int, max_queue: int) -> None:
        self.slots = Gate(pool_size)
        self.max_queue = max_queue
        self.queued = 0  # changed on the loop only; read from any thread

    @property
    def busy(self) -> int:
        """Calls executing right now."""
        return self.slots.in_use

    def enter_queue(self) -> Ticket:
        """Count a call as waiting (on the loop); :class:`ExecutorBusyError` when full."""
        if self.queued >= self.max_queue:
            raise ExecutorBusyError(
                f"the Python executor queue is full ({self.max_queue} calls waiting); retry later",
                retryable=True,
            )
        self.queued += 1
        return Ticket(self)

    async def acquire(
        self, gate: Gate | None, ticket: Ticket, usable: Callable[[], bool] = _always
    ) -> bool:
        """Wait for the session's ``gate`` (None: a fresh interpreter), then a slot.

        False, holding nothing, when ``usable()`` (checked once the gate is
        held) says the session went away meanwhile. The call leaves the queue
        count once it holds a slot.
        """
        if gate is not None:
            await gate.acquire()
            if not usable():
                gate.release()
                return False
        try:
            await self.slots.acquire()
        except BaseException:
            if gate is not None:
                gate.release()
            raise
        ticket.leave()
        return True

    def try_acquire(self, gate: Gate, usable: Callable[[], bool] = _always) -> bool:
        """:meth:`acquire` without waiting (any thread); False, holding nothing, if it would wait.

        Calls already queued go first: with a full queue this admits nothing
        (the loop route then refuses the call).
        """
        if self.queued >= self.max_queue or not gate.try_acquire():
            return False
        if usable() and self.slots.try_acquire():
            return True
        gate.release()
        return False

    def release(self, gate: Gate | None) -> None:
        """Give back the slot, then the session's gate."""
        self.slots.release()
        if gate is not None:
            gate.release()
