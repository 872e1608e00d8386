"""Defaults for the executor's sandbox settings.

The isolation layers live in :mod:`toolservices.python._sandbox`; this module
only picks where session directories go and checks a user's settings.
"""

from __future__ import annotations

import os

from toolservices.errors import UserError
from toolservices.python._sandbox import SandboxConfig

__all__ = ["check_config", "default_config", "fast_tmp_dir"]


def check_config(config: object) -> SandboxConfig:
    """``config`` if it is a :class:`SandboxConfig`; a developer error otherwise."""
    if not isinstance(config, SandboxConfig):
        raise UserError(
            "sandbox must be a toolservices.python.SandboxConfig (or None for the defaults), "
            f"got {type(config).__name__}"
        )
    return config


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


def default_config() -> SandboxConfig:
    """The default settings, with session directories on tmpfs when possible."""
    fast = fast_tmp_dir()
    return SandboxConfig(base_dir=fast) if fast is not None else SandboxConfig()
