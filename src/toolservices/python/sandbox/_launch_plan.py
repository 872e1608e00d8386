"""A fork server's launch plan (:class:`LaunchPlan`) and what each session applies.

Host side. :func:`~toolservices.python.sandbox._planner.build_plan` makes the
plans; a plan owns the dedicated uid's slot and the host directory the
sessions' working directories go in, until :meth:`LaunchPlan.close`.
:func:`session_state` is what each session applies to itself
(``runtime/_confine.py``), serialised into the server's environment.
"""

from __future__ import annotations

import atexit
import os
import subprocess
import threading
from dataclasses import dataclass, field
from typing import Any

from toolservices.python import runtime
from toolservices.python.runtime import remove_tree
from toolservices.python.sandbox import _memcg
from toolservices.python.sandbox import _probe as probe_mod
from toolservices.python.sandbox._config import SandboxConfig
from toolservices.python.sandbox._report import config_rlimits

__all__ = [
    "WORKDIR_BASE_PLACEHOLDER",
    "LaunchPlan",
    "enter_session",
    "kill_uid",
    "session_state",
]

_INSIDE_BASE = "/sandbox"  # where the workdir base appears inside bubblewrap
WORKDIR_BASE_PLACEHOLDER = "@WORKDIR_BASE@"
"""An argv element equal to this is replaced by the plan's ``workdir_base``."""


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
    #: the executor's memory cgroup (host path), removed by close()
    memcg_dir: str | None = None
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
        release(self.uid, self.host_workdir_base, self._slot_fd, self.memcg_dir)

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


def release(
    uid: int | None, host_base: str, slot_fd: int | None, memcg_dir: str | None = None
) -> None:
    """Free what a plan holds: sweep ``uid`` (if any), delete the base and the memory
    cgroup, free the uid slot."""
    try:
        if uid is not None:
            kill_uid(uid)
        remove_tree(host_base)
    finally:
        if memcg_dir is not None:
            _memcg.remove(memcg_dir)  # empty now; a stale one goes at the next plan's sweep
        if slot_fd is not None:
            os.close(slot_fd)  # releases the flock


def kill_uid(uid: int, *, rounds: int = 20) -> int:
    """SIGKILL every process of ``uid`` (root only); return how many were left at the start."""
    found = left = probe_mod.pids_of_uid(uid)
    for _ in range(rounds):
        if not left:
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
        left = probe_mod.pids_of_uid(uid)
    return len(found)


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
    workspace: str | None = None,
) -> dict[str, Any]:
    """What each session applies to itself (serialised into the server's environment).

    ``keep``: paths the session's own /tmp and /dev/shm must not hide;
    ``workspace``: the fixed path of every session's directory (needs ``session_ns``).
    """
    rlimits = {**config_rlimits(config), "NPROC": None}
    return {
        "session_ns": {
            "tmp_size": config.tmp_size,
            "keep": list(keep or ()),
            "disk_quota": getattr(config, "disk_quota", None),
            "workspace": workspace,
            "own_pids": bool(getattr(config, "own_pids", False)),
            # each session its own network namespace with only lo up (docs/sandbox.md)
            "loopback": config.network == "loopback",
            "root": list(getattr(config, "root_layers", ())),
            # sessions may stand on an image (the service's, or one a SPAWN names)
            "images": bool(
                getattr(config, "root_layers", ()) or getattr(config, "image_caches", ())
            ),
            "python": getattr(config, "root_python", ""),
        }
        if session_ns
        else None,
        "nproc_headroom": nproc,
        "nproc_hidden": nproc_hidden,
        "level": level,
        "rlimits": rlimits,
        "landlock": landlock_paths,
        "seccomp_program": seccomp_hex,
    }


def enter_session(config: SandboxConfig | None = None, *, workdir: str) -> None:
    """Confine this process as a session (the runtime's ``enter_session``).

    The state comes from the server's environment when it was started
    through ``plan_server_launch``; otherwise it is built here from ``config``
    (the runtime itself takes only the plain state: it imports no sandbox).
    """
    state = None if config is None else session_state(config, nproc=config.nproc)
    runtime.enter_session(state, workdir=workdir)
