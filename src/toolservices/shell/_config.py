"""How a ``ShellService`` is configured: the sandbox of its sessions, its limits, where its
sessions start, and the checks of the arguments every method takes."""

from __future__ import annotations

import dataclasses
import glob
import math
from typing import TYPE_CHECKING

from toolservices.errors import UserError
from toolservices.python.sandbox import (
    SandboxConfig,
    check_config,
    default_config,
    image_config,
)
from toolservices.shell._images import check_bash

if TYPE_CHECKING:
    from toolservices.images import Image

__all__ = [
    "COMMAND_STACK",
    "DEFAULT_DISK_QUOTA",
    "GRACE",
    "SESSION_BYTES",
    "SESSION_FDS",
    "SHELL_NPROC",
    "check_session",
    "check_timeout",
    "session_sandbox",
    "shell_config",
]

#: seconds the supervisor gets beyond a command's own limit to kill its tree and report
GRACE = 5.0
#: memory reserved per idle shell session for the default ``max_sessions``: 5.9-6.4 MiB
#: PSS measured (the supervisor, its spawner, a waiting bash; docs/benchmarks.md), rounded
#: up. Files in a workspace take memory too (a tmpfs), up to its ``disk_quota``.
SESSION_BYTES = 8 << 20
#: descriptors a shell session holds in the caller: the Python session's, plus its user
#: and mount namespaces (what fork_session copies its workspace through)
SESSION_FDS = 5
#: the default size cap of a session's workspace (each fork_session copy has its own)
DEFAULT_DISK_QUOTA = 1 << 30
#: The soft stack limit of commands: a usual terminal's (glibc sizes thread stacks from it).
COMMAND_STACK = 8 * 1024 * 1024
#: Tasks (processes and threads) per shell session when no sandbox is given.
SHELL_NPROC = 256
#: /etc paths of toolchains the read-only root shows to shell sessions (when they exist).
_TOOLCHAIN_ETC = ("/etc/java-*",)


def check_timeout(value: object, name: str = "timeout") -> float:
    """A limit in seconds as a float; a :class:`UserError` naming ``name`` otherwise."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise UserError(f"{name} must be a number of seconds > 0, got {value!r}")
    if not math.isfinite(value) or value <= 0:
        raise UserError(f"{name} must be a finite number of seconds > 0, got {value!r}")
    return float(value)


def check_session(value: object, *, required: bool = False) -> str | None:
    """A session id (a non-empty str; None, a fresh shell, where not ``required``)."""
    if value is None and not required:
        return None
    if not isinstance(value, str) or not value:
        raise UserError(f"session_id must be a non-empty str, got {value!r}")
    return value


def session_sandbox(
    config: SandboxConfig, *, image: Image | None, reference: str | None, disk_quota: int | None
) -> SandboxConfig:
    """The sandbox of every session: ``config`` (from :func:`shell_config`) on the image (which
    must have a bash) with the workspace's quota; the workspace at one path (where session
    namespaces allow it), each session its own PID namespace and /proc (see docs/shell.md,
    "Isolation")."""
    if image is not None:
        config = image_config(config, check_bash(image, str(reference)))
    if disk_quota is not None:
        if isinstance(disk_quota, bool) or not isinstance(disk_quota, int) or disk_quota <= 0:
            raise UserError(f"disk_quota must be a positive int or None, got {disk_quota!r}")
        config = dataclasses.replace(config, disk_quota=disk_quota)
    return dataclasses.replace(config, fixed_workspace=True, own_pids=True)


def shell_config(sandbox: object) -> SandboxConfig:
    """The sandbox of a shell service: ``sandbox``, or the defaults with :data:`SHELL_NPROC`;
    ``address_space="auto"`` becomes ``"cgroup"`` (toolchains reserve address space)."""
    config = (
        dataclasses.replace(default_config(), nproc=SHELL_NPROC)
        if sandbox is None
        else check_config(sandbox)
    )
    if config.address_space == "auto":
        config = dataclasses.replace(config, address_space="cgroup")
    # the host's toolchains read their configuration there (a JDK's conf/ links into it)
    wanted = [p for pattern in _TOOLCHAIN_ETC for p in sorted(glob.glob(pattern))]
    extra = tuple(p for p in wanted if p not in config.extra_ro_paths)
    if extra:
        config = dataclasses.replace(config, extra_ro_paths=(*config.extra_ro_paths, *extra))
    return config
