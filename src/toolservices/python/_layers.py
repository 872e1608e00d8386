"""Which isolation module the sessions use.

The layered sandbox lives in :mod:`toolservices.python._sandbox`; when it is
not importable (a partial install, or during development) the minimal
:mod:`toolservices.python._fallback` provides the same four names with only
the always-on layer. The executor never talks to either directly.
"""

from __future__ import annotations

import dataclasses
import importlib
import os
import sys
from types import ModuleType
from typing import Any

__all__ = ["default_config", "fast_tmp_dir", "layers_for", "layers_module"]

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


def layers_for(config: Any) -> ModuleType:
    """The module that defines ``type(config)``: its functions apply that config."""
    module = sys.modules.get(type(config).__module__)
    if module is None or not all(hasattr(module, name) for name in _REQUIRED):
        from toolservices.errors import UserError

        raise UserError(
            f"sandbox must be a SandboxConfig (toolservices.python.SandboxConfig), "
            f"got {type(config).__name__}"
        )
    return module


def fast_tmp_dir() -> str | None:
    """``/dev/shm`` when it is a writable tmpfs, else None (the system default).

    Session directories are created and deleted for every fresh-process run;
    on a disk mounted with ``discard`` one ``rmdir`` takes milliseconds, on
    tmpfs microseconds.
    """
    try:
        with open("/proc/mounts") as mounts:
            tmpfs = any(
                line.split()[1:3] == ["/dev/shm", "tmpfs"] for line in mounts if line.strip()
            )
    except OSError:
        return None
    return "/dev/shm" if tmpfs and os.access("/dev/shm", os.W_OK | os.X_OK) else None


def default_config(module: ModuleType) -> Any:
    """The module's default settings, with session directories on tmpfs when possible."""
    config_cls = module.SandboxConfig
    fast = fast_tmp_dir()
    names = {f.name for f in dataclasses.fields(config_cls)}
    if fast is not None and "base_dir" in names:
        return config_cls(base_dir=fast)
    return config_cls()
