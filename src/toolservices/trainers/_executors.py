"""The executors that tools built from a trainer's config share in one process.

verl builds every tool from YAML, in every rollout worker, with no object
that spans the tools of a worker: no parent can own "the executor of this
worker's python tools". :class:`SharedExecutors` is that owner, one per
process (:data:`SHARED_EXECUTORS`): one Python executor or shell service per
distinct configuration, created on first use, and closed together by :meth:`SharedExecutors.close`
(a later use starts a fresh one). At interpreter exit each executor's own
safety net stops its interpreters, and a forked child starts with none.
"""

from __future__ import annotations

import json
import os
import threading
from typing import TYPE_CHECKING, Any

from toolservices.python import PythonExecutorService

if TYPE_CHECKING:
    from toolservices.shell import ShellService

__all__ = ["SHARED_EXECUTORS", "SharedExecutors"]


class SharedExecutors:
    """Executors keyed by their configuration, shared by the tools of one process."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._executors: dict[str, PythonExecutorService] = {}
        self._shells: dict[str, ShellService] = {}

    def __len__(self) -> int:
        return len(self._executors) + len(self._shells)

    def get(self, **config: Any) -> PythonExecutorService:
        """The executor for ``config`` (keyword arguments of ``PythonExecutorService``)."""
        key = json.dumps(config, sort_keys=True, default=str)
        with self._lock:
            executor = self._executors.get(key)
            if executor is None:
                executor = self._executors[key] = PythonExecutorService(**config)
            return executor

    def shell(self, **config: Any) -> ShellService:
        """The shell service for ``config`` (keyword arguments of ``ShellService``)."""
        from toolservices.shell import ShellService

        key = json.dumps(config, sort_keys=True, default=str)
        with self._lock:
            shell = self._shells.get(key)
            if shell is None:
                shell = self._shells[key] = ShellService(**config)
            return shell

    def close(self) -> None:
        """Close every executor and shell service (their sessions end); later uses start anew."""
        with self._lock:
            executors: list[PythonExecutorService | ShellService] = list(self._executors.values())
            executors += self._shells.values()
            self._executors, self._shells = {}, {}
        for executor in executors:
            executor.close()

    def _forget(self) -> None:
        # a forked child does not own the parent's fork servers
        self._lock = threading.Lock()
        self._executors = {}
        self._shells = {}


#: The process's owner of the executors that config-built tools share.
SHARED_EXECUTORS = SharedExecutors()
os.register_at_fork(after_in_child=SHARED_EXECUTORS._forget)
