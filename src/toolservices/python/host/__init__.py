"""The host side: what runs in the caller's process (and on the library's event loop).

* ``_service``: :class:`PythonExecutorService`: its configuration and its sync and async faces;
* ``_sessions``: the session table (a call in a session or a fresh interpreter,
  eviction, closing and copying sessions), a base of the service;
* ``_pool``: the fork server and the spare interpreters (on the service's image, and on
  the other images sessions were last started on: :class:`SpawnRoot`), the base below it;
* ``_args``: the checks of the arguments; the image a service runs on and its sandbox;
* ``_admission``: the queue count and the gates every call passes (both routes);
* ``_gate``: the thread-safe counting lock behind them;
* ``_client``: the fork-server process and its control channel, one
  :class:`SessionHandle` per interpreter;
* ``_channel``: the parent's end of a framed channel and its request/reply;
* ``_forking``: ``fork_session``'s and ``spawn_with_files``' parent side;
* ``_persistent``, ``_result``: the contract's faces;
* ``_selftest``: the sandbox's self-test, run through an executor;
* ``_sizing``: the default ``max_sessions``, from the memory free.
"""

from __future__ import annotations

from toolservices.python.host._args import check_timeout, pull_image
from toolservices.python.host._persistent import PersistentPythonProcess
from toolservices.python.host._pool import IMAGE_SPARES, SpawnRoot
from toolservices.python.host._result import ExceptionInfo, ExecResult, ResultMapping
from toolservices.python.host._selftest import self_test
from toolservices.python.host._service import PythonExecutorService
from toolservices.python.host._sizing import default_max_sessions

__all__ = [
    "IMAGE_SPARES",
    "ExceptionInfo",
    "ExecResult",
    "PersistentPythonProcess",
    "PythonExecutorService",
    "ResultMapping",
    "SpawnRoot",
    "check_timeout",
    "default_max_sessions",
    "pull_image",
    "self_test",
]
