"""The Python executors that tools built from a trainer's config share in one process.

verl builds every tool from YAML, in every rollout worker, with no object
that spans the tools of a worker: no parent can own "the executor of this
worker's python tools". :class:`SharedExecutors` is that owner, one per
process (:data:`SHARED_EXECUTORS`): one executor per distinct configuration,
created on first use, and closed together by :meth:`SharedExecutors.close`
(a later use starts a fresh one). At interpreter exit each executor's own
safety net stops its interpreters, and a forked child starts with none.
"""

from __future__ import annotations

import json
import os
import threading
from typing import Any

from toolservices.python import PythonExecutorService

__all__ = ["SHARED_EXECUTORS", "SharedExecutors"]


class SharedExecutors:
    """Executors keyed by their configuration, shared by the tools of one process."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._executors: dict[str, PythonExecutorService] = {}

    def __len__(self) -> int:
        return len(self._executors)

    def get(self, **config: Any) -> PythonExecutorService:
        """The executor for ``config`` (keyword arguments of ``PythonExecutorService``)."""
        key = json.dumps(config, sort_keys=True, default=str)
        with self._lock:
            executor = self._executors.get(key)
            if executor is None:
                executor = self._executors[key] = PythonExecutorService(**config)
            return executor

    def close(self) -> None:
        """Close every executor (their sessions end); the next :meth:`get` starts anew."""
        with self._lock:
            executors, self._executors = list(self._executors.values()), {}
        for executor in executors:
            executor.close()

    def _forget(self) -> None:
        # a forked child does not own the parent's fork servers
        self._lock = threading.Lock()
        self._executors = {}


#: The process's owner of the executors that config-built tools share.
SHARED_EXECUTORS = SharedExecutors()
os.register_at_fork(after_in_child=SHARED_EXECUTORS._forget)
