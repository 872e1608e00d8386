"""``PersistentPythonProcess``: the contract's one-interpreter face."""

from __future__ import annotations

import os
import threading
import uuid
from typing import Any

from toolservices.python.host._result import ExecResult
from toolservices.python.host._service import PythonExecutorService

__all__ = ["PersistentPythonProcess"]

_shared_lock = threading.Lock()
_shared: PythonExecutorService | None = None


def _shared_service() -> PythonExecutorService:
    """One executor per process for all ``PersistentPythonProcess`` objects.

    Each object is one session in it, so a hundred of them cost a hundred
    forks, not a hundred fork servers. Its owner is the class: created on
    first use, closed by :meth:`PersistentPythonProcess.shutdown_shared`
    (the next object starts a fresh one), stopped at exit by the executor's
    own safety net, and forgotten by a forked child.
    """
    global _shared
    with _shared_lock:
        if _shared is None:
            _shared = PythonExecutorService(pool_size=64, max_sessions=4096)
        return _shared


def _forget_shared_in_child() -> None:
    # a forked copy of this process does not own the parent's fork server
    global _shared
    _shared = None


os.register_at_fork(after_in_child=_forget_shared_in_child)


class PersistentPythonProcess:
    """One persistent interpreter: variables survive between ``execute`` calls.

    A thin face over one session of a :class:`PythonExecutorService` (a
    process-wide shared one unless ``service`` is given). A timeout, crash or
    ``os._exit`` restarts the interpreter; the result says so (``restarted``).
    """

    def __init__(
        self, timeout: float = 10.0, *, service: PythonExecutorService | None = None
    ) -> None:
        self.timeout = timeout
        self._service = service if service is not None else _shared_service()
        self.session_id = f"persistent-{uuid.uuid4().hex}"
        self._closed = False

    def execute(self, code: str) -> ExecResult:
        """Run ``code`` in this interpreter; a Mapping with the contract's keys."""
        if self._closed:
            self._closed = False  # like TorchRL's object, usable again after cleanup()
        return self._service.execute(code, session_id=self.session_id, timeout=self.timeout)

    async def aexecute(self, code: str) -> ExecResult:
        self._closed = False
        return await self._service.aexecute(code, session_id=self.session_id, timeout=self.timeout)

    def cleanup(self) -> None:
        """End the interpreter and delete its working directory."""
        if not self._closed:
            self._closed = True
            self._service.close_session(self.session_id)

    close = cleanup

    @staticmethod
    def shutdown_shared() -> None:
        """Close the executor that objects made without ``service=`` share.

        Their interpreters end (a later ``execute`` of such an object fails
        with an infrastructure error naming the closed executor); objects
        made afterwards get a fresh executor. A no-op when none was started.
        """
        global _shared
        with _shared_lock:
            shared, _shared = _shared, None
        if shared is not None:
            shared.close()

    def __enter__(self) -> PersistentPythonProcess:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.cleanup()
