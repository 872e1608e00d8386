"""Which isolation module the sessions use.

The layered sandbox lives in :mod:`toolservices.python._sandbox`; when it is
not importable (a partial install, or during development) the minimal
:mod:`toolservices.python._fallback` provides the same four names with only
the always-on layer. The executor never talks to either directly.
"""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import Any

__all__ = ["default_config", "layers_module"]

_REQUIRED = ("SandboxConfig", "plan_server_launch", "enter_session", "isolation_report")


def layers_module() -> ModuleType:
    """The sandbox module if it provides the agreed interface, else the fallback."""
    try:
        module = importlib.import_module("toolservices.python._sandbox")
    except ImportError:
        module = None
    if module is not None and all(hasattr(module, name) for name in _REQUIRED):
        return module
    return importlib.import_module("toolservices.python._fallback")


def default_config(module: ModuleType) -> Any:
    return module.SandboxConfig()
