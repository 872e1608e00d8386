"""The probe launch: what a planned server would really get (``python -I -S _probe.py``).

The planner (``sandbox/_planner.py``) starts this module in place of the fork
server, through the very launcher, bubblewrap and environment it plans; it
prints one JSON report of the layers it observes from inside, including those
of one session forked and confined exactly as the fork server forks them.
"""

from __future__ import annotations

if __name__ == "__main__" and not __package__:  # started by path (the only way it runs)
    import sys  # (-I leaves the script's directory off sys.path)

    sys.path.insert(0, __file__.rpartition("/")[0])
    import _bootstrap  # noqa: F401

import json
import os
import resource
import sys
from typing import Any

from . import _confine

__all__ = ["probe"]


def probe() -> dict[str, Any]:
    """Observe, from inside a launched server, which layers are really in force."""
    status: dict[str, str] = {}
    with open("/proc/self/status", encoding="ascii", errors="replace") as fh:
        for line in fh:
            key, _, value = line.partition(":")
            status[key] = value.strip()
    ns: dict[str, str] = {}
    for kind in ("pid", "net", "mnt", "ipc", "uts", "user"):
        try:
            ns[kind] = os.readlink(f"/proc/self/ns/{kind}")
        except OSError as exc:
            ns[kind] = f"error: {exc.strerror}"
    result: dict[str, Any] = {
        "uid": os.getuid(),
        "euid": os.geteuid(),
        "pid": os.getpid(),
        "no_new_privs": status.get("NoNewPrivs") == "1",
        "seccomp_mode": int(status.get("Seccomp", "0") or 0),
        "cap_eff": status.get("CapEff", ""),
        "ns": ns,
        "landlock_abi": _confine.landlock_abi(),
        "python": sys.executable,
        "root_listing": sorted(os.listdir("/")),
        "rlimit_nproc": resource.getrlimit(resource.RLIMIT_NPROC)[0],
    }
    if _confine.STATE_ENV in os.environ:
        result["session"] = _probe_session()
    return result


def _probe_session() -> dict[str, Any]:
    """Fork one session exactly as the server will and report what it got."""
    base = os.environ.get("TOOLSERVICES_WORKDIR_BASE") or "/tmp"
    workdir = os.path.join(base, f"probe-{os.getpid()}")
    os.mkdir(workdir, 0o700)
    read_fd, write_fd = os.pipe()

    def failed(exc: BaseException) -> None:  # reported to the planner
        report = {"entered": False, "error": f"{type(exc).__name__}: {exc}"}
        os.write(write_fd, json.dumps(report).encode())

    pid = _confine.fork_confined(workdir, prepare=lambda: os.close(read_fd), failed=failed)
    if pid == 0:  # the probe session
        try:
            with open("/proc/self/status", encoding="ascii") as fh:
                status = dict(line.rstrip("\n").split(":\t", 1) for line in fh if ":\t" in line)
            state = _confine._load_state()
            report: dict[str, Any] = {
                "entered": True,
                "session_ns": bool(state and state.get("session_ns")),
                "own_pids": _confine.own_pids(state) and os.getpid() == 1,
                "cap_eff": status.get("CapEff", ""),
                "no_new_privs": status.get("NoNewPrivs") == "1",
                "seccomp_mode": int(status.get("Seccomp", "0")),
                "enter_seconds": _confine.last_enter_seconds,
                "uid": os.getuid(),
            }
        except BaseException as exc:  # noqa: BLE001 - reported to the planner, then exit
            report = {"entered": False, "error": f"{type(exc).__name__}: {exc}"}
        os.write(write_fd, json.dumps(report).encode())
        os._exit(0)
    os.close(write_fd)
    chunks = []
    while chunk := os.read(read_fd, 65536):
        chunks.append(chunk)
    os.close(read_fd)
    os.waitpid(pid, 0)  # with own_pids our grandchild, re-parented to us (fork_confined)
    _confine.remove_tree(workdir)
    try:
        result: dict[str, Any] = json.loads(b"".join(chunks) or b"{}")
    except ValueError:
        result = {"entered": False, "error": "the probe session died before reporting"}
    return result


if __name__ == "__main__":
    sys.stdout.write(json.dumps(probe()))
