"""Facts about this machine that the sandbox plan needs (host side).

Where the server's interpreter and its modules live, which of those paths a
dedicated uid cannot traverse, how many tasks a uid already runs, and the
probe launch that checks a plan for real.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import signal
import stat
import subprocess
from dataclasses import dataclass
from typing import Any

__all__ = [
    "PythonPaths",
    "blocking_ancestor",
    "pids_of_uid",
    "python_paths",
    "reach_groups",
    "run_probe",
]

PROBE_TIMEOUT = 20.0  # a cold interpreter under bwrap on a loaded 2-core machine


@dataclass(frozen=True)
class PythonPaths:
    """Directories a server interpreter reads: prefixes, sys.path, and where toolservices is."""

    executable: str
    read_paths: tuple[str, ...]
    pythonpath: str  # extra PYTHONPATH so the server finds toolservices ("" when not needed)


def _dedupe(paths: list[str]) -> tuple[str, ...]:
    """Drop duplicates and paths inside another listed path (bind each tree once)."""
    result: list[str] = []
    for path in sorted({os.path.realpath(p) for p in paths if p and os.path.isabs(p)}):
        if not os.path.exists(path):
            continue
        if any(path == kept or path.startswith(kept.rstrip("/") + "/") for kept in result):
            continue
        result.append(path)
    return tuple(result)


@functools.lru_cache(maxsize=8)
def python_paths(python: str) -> PythonPaths:
    """Ask ``python`` (once) for its prefixes and sys.path, and locate toolservices."""
    # the directory holding the toolservices package (src/ or site-packages)
    pkg_parent = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
    # Always ask the interpreter itself, isolated (-I): the caller's own sys.path holds its
    # script and test directories, which the sandbox must not see.
    code = (
        "import sys, json; print(json.dumps({'exe': sys.executable, 'prefix': sys.prefix,"
        " 'base': sys.base_prefix, 'exec': sys.exec_prefix, "
        "'base_exec': sys.base_exec_prefix, 'path': sys.path}))"
    )
    out = subprocess.run(
        [python, "-I", "-c", code],
        capture_output=True,
        text=True,
        timeout=PROBE_TIMEOUT,
        check=True,
        env={"PATH": "/usr/bin:/bin"},
    )
    info: dict[str, Any] = json.loads(out.stdout)
    sys_path = [p for p in info["path"] if p and os.path.isabs(p)]
    found = any(os.path.realpath(p) == os.path.realpath(pkg_parent) for p in sys_path)
    paths = [
        info["prefix"],
        info["base"],
        info["exec"],
        info["base_exec"],
        *sys_path,
        os.path.dirname(os.path.realpath(python)),
        os.path.dirname(str(info["exe"])),
        pkg_parent,
    ]
    return PythonPaths(
        executable=python, read_paths=_dedupe(paths), pythonpath="" if found else pkg_parent
    )


def blocking_ancestor(path: str, uid: int, gid: int) -> str | None:
    """The first directory on ``path`` that ``uid`` (with no supplementary groups) cannot search."""
    current = "/"
    for part in [p for p in os.path.realpath(path).split("/") if p]:
        st = os.stat(current)
        if st.st_uid == uid:
            allowed = bool(st.st_mode & stat.S_IXUSR)
        elif st.st_gid == gid:
            allowed = bool(st.st_mode & stat.S_IXGRP)
        else:
            allowed = bool(st.st_mode & stat.S_IXOTH)
        if not allowed:
            return current
        current = os.path.join(current, part)
    return None


def reach_groups(paths: list[tuple[str, bool]], uid: int) -> list[dict[str, Any]]:
    """Launcher instructions making each (path, read_only) reachable by ``uid`` (see launcher)."""
    groups: dict[str, list[dict[str, Any]]] = {}
    for path, read_only in paths:
        real = os.path.realpath(path)
        ancestor = blocking_ancestor(real, uid, uid)
        if ancestor is None:
            continue
        groups.setdefault(ancestor, []).append(
            {"path": real, "ro": read_only, "is_dir": os.path.isdir(real)}
        )
    return [{"ancestor": a, "paths": p} for a, p in sorted(groups.items())]


def _status(pid: str) -> dict[str, str]:
    try:
        with open(f"/proc/{pid}/status", encoding="ascii", errors="replace") as fh:
            return dict(line.rstrip("\n").split(":\t", 1) for line in fh if ":\t" in line)
    except OSError:  # gone meanwhile
        return {}


def pids_of_uid(uid: int) -> list[int]:
    """Live (non-zombie) processes whose real uid is ``uid`` (from /proc)."""
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        status = _status(pid)
        uids = status.get("Uid", "").split()
        if uids and int(uids[0]) == uid and not status.get("State", "").startswith(("Z", "X")):
            found.append(int(pid))
    return found


def run_probe(argv: list[str], env: dict[str, str]) -> dict[str, Any]:
    """Run a planned command whose server is replaced by ``runtime/_probe.py``.

    Returns the probe's JSON, or ``{"error": ...}`` with the launcher's or
    bwrap's own message.
    """
    try:
        proc = subprocess.Popen(
            argv,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,  # its own group: a timeout kills what it started too
        )
    except OSError as exc:
        return {"error": f"cannot start the launcher: {exc}"}
    with proc:
        try:
            out, err = proc.communicate(timeout=PROBE_TIMEOUT)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            return {"error": f"probe launch did not finish within {PROBE_TIMEOUT:g} s"}
    stderr = err.decode(errors="replace").strip()
    if proc.returncode != 0:
        return {"error": (stderr.splitlines() or [f"exit status {proc.returncode}"])[-1]}
    try:
        result: dict[str, Any] = json.loads(out)
    except ValueError:
        return {"error": f"probe printed no report (stderr: {stderr[-300:]!r})"}
    return result
