"""What the shell's hardening (issue 24) costs, part by part, side by side in one process.

Run: PYTHONPATH=src .venv/bin/python benchmarks/bench_hardening.py [--quick]

* each bash's own Landlock domain (``own_domain``): one call, in forked children
  (a process takes at most 16 Landlock layers);
* each session's own PID namespace: a new Python session and its first call,
  ``SandboxConfig(own_pids=False)`` and ``True`` alternated, no spares;
* the seed copy of a deep directory chain (``copy_into``) at growing depths: time
  per level stays flat when the copy is linear in the depth.

Prints medians.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import statistics
import tempfile
import time

from _util import fmt_time

from toolservices.python import PythonExecutorService
from toolservices.python.runtime import remove_tree
from toolservices.python.runtime._seed import copy_into
from toolservices.python.sandbox import SandboxConfig
from toolservices.shell._spawner import own_domain

_PR_SET_NO_NEW_PRIVS = 38


def landlock_domain(children: int) -> float:
    """Median seconds of one ``own_domain`` call (14 per child: the layer cap is 16)."""
    samples: list[float] = []
    for _ in range(children):
        read_fd, write_fd = os.pipe()
        pid = os.fork()
        if pid == 0:
            lib = ctypes.CDLL(None, use_errno=True)
            lib.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)  # as in a session
            times = []
            for _ in range(14):
                started = time.perf_counter()
                own_domain(lib)
                times.append(time.perf_counter() - started)
            os.write(write_fd, " ".join(map(str, times)).encode())
            os._exit(0)
        os.close(write_fd)
        data = os.read(read_fd, 65536)
        os.close(read_fd)
        os.waitpid(pid, 0)
        samples += [float(x) for x in data.split()]
    return statistics.median(samples)


def new_sessions(rounds: int) -> dict[bool, float]:
    """Median seconds of a new session's first call, without and with ``own_pids``."""
    services = {
        flag: PythonExecutorService(
            pool_size=1, spares=0, sandbox=SandboxConfig(own_pids=flag, fixed_workspace=True)
        )
        for flag in (False, True)
    }
    samples: dict[bool, list[float]] = {False: [], True: []}
    try:
        for svc in services.values():
            svc.execute("1", session_id="warm")
        for index in range(rounds):
            for flag, svc in services.items():
                started = time.perf_counter()
                svc.execute("1", session_id=f"s{index}")
                samples[flag].append(time.perf_counter() - started)
                svc.close_session(f"s{index}")
    finally:
        for svc in services.values():
            svc.close()
    return {flag: statistics.median(values) for flag, values in samples.items()}


def deep_copy(depth: int) -> float:
    """Seconds to copy a chain of ``depth`` directories (on tmpfs when /dev/shm is one)."""
    base = tempfile.mkdtemp(dir="/dev/shm" if os.path.isdir("/dev/shm") else None)
    try:
        src, dst = os.path.join(base, "src"), os.path.join(base, "dst")
        os.mkdir(src)
        os.mkdir(dst)
        fd = os.open(src, os.O_RDONLY | os.O_DIRECTORY)
        for _ in range(depth):
            os.mkdir("d", dir_fd=fd)
            nxt = os.open("d", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
            os.close(fd)
            fd = nxt
        os.close(fd)
        top = os.open(src, os.O_RDONLY | os.O_DIRECTORY)
        try:
            started = time.perf_counter()
            copy_into(top, dst, workers=1)
            return time.perf_counter() - started
        finally:
            os.close(top)
    finally:
        remove_tree(base)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    print(f"# load average {os.getloadavg()}, {os.cpu_count()} CPUs")
    print(f"own Landlock domain per bash: {fmt_time(landlock_domain(10 if args.quick else 40))}")
    sessions = new_sessions(15 if args.quick else 60)
    print(
        f"new session + first call, no spares: own_pids off {fmt_time(sessions[False])}, "
        f"on {fmt_time(sessions[True])}"
    )
    for depth in (500, 1000, 2000, 4000):
        took = deep_copy(depth)
        print(f"copy of a {depth}-level chain: {fmt_time(took)} ({fmt_time(took / depth)}/level)")


if __name__ == "__main__":
    main()
