"""Sandboxed, session-correct Python execution.

* :class:`PythonExecutorService`: a pool of persistent sessions and fresh
  interpreters forked from a pre-warmed fork server;
* :class:`PersistentPythonProcess`: one persistent interpreter (the contract);
* :class:`ExecResult`: a typed result that reads as the contract's dict;
* :class:`SandboxConfig`: the isolation settings (limits, network, levels);
* :func:`isolation_report`: which isolation layers are active, and why others are not.
"""

from __future__ import annotations

from typing import Any

from toolservices.python._layers import layers_for, layers_module
from toolservices.python._persistent import PersistentPythonProcess
from toolservices.python._result import ExceptionInfo, ExecResult
from toolservices.python._service import PythonExecutorService

try:
    from toolservices.python._sandbox import SandboxConfig
except ImportError:  # a partial install: only the always-on layer
    from toolservices.python._fallback import SandboxConfig  # type: ignore[assignment]

__all__ = [
    "ExceptionInfo",
    "ExecResult",
    "PersistentPythonProcess",
    "PythonExecutorService",
    "SandboxConfig",
    "isolation_report",
]


def isolation_report(config: Any = None) -> dict[str, Any]:
    """Which isolation layers sessions get with ``config`` (default settings if None)."""
    layers = layers_module() if config is None else layers_for(config)
    return dict(layers.isolation_report(config))
