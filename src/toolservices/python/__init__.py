"""Sandboxed, session-correct Python execution.

* :class:`PythonExecutorService`: a pool of persistent sessions and fresh
  interpreters forked from a pre-warmed fork server;
* :class:`PersistentPythonProcess`: one persistent interpreter (the contract);
* :class:`ExecResult`: a typed result that reads as the contract's dict;
* :class:`SandboxConfig`: the isolation settings (limits, network, levels);
* :func:`isolation_report`: which isolation layers are active, and why others are not;
* :func:`self_test`: hostile snippets through a real executor, to show each layer holds.

How it works: the parent starts one fork server per executor (a separate, lean
interpreter that has imported ``preload``; never a fork of the caller). Each
session is a child forked from it into a private working directory, with the
isolation layers applied, talking to the parent over a private socket pair of
length-prefixed frames with per-call sequence numbers. User output goes to two
in-memory files the parent reads after each call (or after a kill), so nothing
the code prints can reach the channel. A timeout, crash or malformed frame
kills the session's whole process tree (sessions are child subreapers; the
server sweeps orphans) and the result says the state was lost.

What it does not do:

* The code runs in the same process as its end of the channel, so it can
  forge its own result frame during a call. Sequence numbers are drawn at
  random per request, so nothing written before a call can pass for its
  reply, and the executor stays in sync (a forged or late frame restarts the
  session), but a result is only what the code chose to report: compute
  rewards and verdicts outside the sandbox.
* A copy made by ``fork_session`` shares its source's namespaces: it writes
  only its own directory (with Landlock), but can read what the source keeps
  in ``/tmp`` and shares its process budget.
* Output printed by background threads or processes after a call returns is
  reported with the next call, or dropped if it lands before that call starts.

Layout (which process each part runs in: ``docs/python.md``): ``host/`` runs
in the caller's process (event loop, channel, gates, client, service);
``runtime/`` in the fork server, the sessions and the launcher (standard
library only); ``sandbox/`` decides and reports the isolation (host side).
"""

from __future__ import annotations

from typing import Any

from toolservices.python import sandbox as _sandbox
from toolservices.python.host import (
    ExceptionInfo,
    ExecResult,
    PersistentPythonProcess,
    PythonExecutorService,
    ResultMapping,
    self_test,
)
from toolservices.python.sandbox import (
    SandboxConfig,
    check_config,
    format_isolation_report,
    format_self_test,
)

__all__ = [
    "ExceptionInfo",
    "ExecResult",
    "PersistentPythonProcess",
    "PythonExecutorService",
    "ResultMapping",
    "SandboxConfig",
    "format_isolation_report",
    "format_self_test",
    "isolation_report",
    "self_test",
]


def isolation_report(config: Any = None) -> dict[str, Any]:
    """Which isolation layers sessions get with ``config`` (default settings if None)."""
    return dict(_sandbox.isolation_report(None if config is None else check_config(config)))
