"""Minimal isolation used when the full sandbox module is not available.

Same interface as :mod:`toolservices.python._sandbox` (``SandboxConfig``,
``plan_server_launch``, ``enter_session``, ``isolation_report``) but only the
"always" layer: an allowlisted environment, its own session, rlimits and a
private working directory. Imports only the standard library: the fork
server loads it by path for ``enter_session``.
"""

from __future__ import annotations

import json
import os
import resource
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

__all__ = [
    "LaunchPlan",
    "SandboxConfig",
    "enter_session",
    "isolation_report",
    "plan_server_launch",
    "session_env",
]

STATE_ENV = "TOOLSERVICES_FALLBACK_LIMITS"
GiB = 1 << 30
MiB = 1 << 20


@dataclass(frozen=True, kw_only=True)
class SandboxConfig:
    """Resource limits applied to every session (``None`` leaves a limit alone)."""

    memory: int | None = 4 * GiB
    cpu: int | None = None
    fsize: int | None = 64 * MiB
    nofile: int | None = 256
    nproc: int | None = None
    network: bool = False
    allow_unsafe: bool = False
    extra_env: tuple[tuple[str, str], ...] = field(default_factory=tuple)


@dataclass(frozen=True, kw_only=True)
class LaunchPlan:
    argv: list[str]
    env: dict[str, str]
    preexec_fn: Callable[[], None] | None
    pass_fds: tuple[int, ...]
    report: dict[str, Any]


def session_env(extra: tuple[tuple[str, str], ...] = ()) -> dict[str, str]:
    """The allowlisted environment: nothing inherited but a sane PATH and locale."""
    env = {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "LANG": "C.UTF-8",
        "LC_ALL": "C.UTF-8",
        "PYTHONUNBUFFERED": "1",
        "PYTHONDONTWRITEBYTECODE": "1",
        "MALLOC_ARENA_MAX": "2",
        "OMP_NUM_THREADS": "1",
        "OPENBLAS_NUM_THREADS": "1",
        "MKL_NUM_THREADS": "1",
    }
    env.update(extra)
    return env


def plan_server_launch(config: SandboxConfig, *, python: str, argv: list[str]) -> LaunchPlan:
    env = session_env(config.extra_env)
    # the server's sessions read their limits from here (the server never sees the config)
    env[STATE_ENV] = json.dumps({str(res): value for res, value in _limits(config).items()})
    return LaunchPlan(
        argv=[python, *argv],
        env=env,
        preexec_fn=None,  # the executor starts it with start_new_session=True
        pass_fds=(),
        report=isolation_report(config),
    )


def _limits(config: SandboxConfig) -> dict[int, int]:
    limits = {resource.RLIMIT_CORE: 0}
    for res, value in (
        (resource.RLIMIT_AS, config.memory),
        (resource.RLIMIT_CPU, config.cpu),
        (resource.RLIMIT_FSIZE, config.fsize),
        (resource.RLIMIT_NOFILE, config.nofile),
        (resource.RLIMIT_NPROC, config.nproc),
    ):
        if value is not None:
            limits[res] = value
    return limits


def enter_session(config: SandboxConfig | None, *, workdir: str) -> None:
    """Apply the rlimits and move into the working directory (in the session child)."""
    if config is not None:
        limits = _limits(config)
    else:
        state = os.environ.get(STATE_ENV)
        limits = {int(k): v for k, v in json.loads(state).items()} if state else {}
    os.environ.pop(STATE_ENV, None)
    for res, value in limits.items():
        resource.setrlimit(res, (value, value))
    os.chdir(workdir)


def isolation_report(config: SandboxConfig | None = None) -> dict[str, Any]:
    config = config or SandboxConfig()
    return {
        "level": "L1-minimal",
        "env": "cleared (allowlist)",
        "process_group": "own session (setsid)",
        "workdir": "private, deleted at session end",
        "rlimits": {str(k): v for k, v in _limits(config).items()},
        "config": asdict(config),
        "missing": {
            "network": "not isolated: the sandbox module is not available",
            "filesystem": "not isolated: the sandbox module is not available",
            "uid": "not dropped: the sandbox module is not available",
        },
    }
