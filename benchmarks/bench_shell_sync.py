"""ShellService's sync faces, two source trees side by side (e.g. main and a branch).

Run: .venv/bin/python benchmarks/bench_shell_sync.py --anchor /path/to/main/src
     --candidate src [--rounds 60] [--batch 10]

Each tree gets a child process of its own that holds one warm ``ShellService``
session; the parent asks them for a few calls at a time in turn (anchor,
candidate, candidate, anchor, ...), so both see the same machine load. Measured
per call, through the sync API: ``run("echo hi")`` back to back,
``write_file`` + ``read_file`` of a small file, ``run("echo hi")`` after a
20 ms pause, a command that changes the shell state (``export N=<i>; cd .``)
back to back and paused; and, for comparison, ``await arun("echo hi")`` on a loop of the
caller's own. Prints the median of all calls of each, and candidate / anchor.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

PAUSE = 0.02

CHILD = r"""
import asyncio, json, sys, time
from toolservices.shell import ShellService

svc = ShellService(pool_size=2, max_sessions=8)
sid = "bench"
svc.run("cd /tmp", session_id=sid)
loop = asyncio.new_event_loop()  # the caller's own loop, as an async harness has


counter = [0]


def batch(kind, n):
    samples = []  # every call's time: the parent takes the median over all batches
    for _ in range(n):
        if kind.endswith("_paused"):
            time.sleep(0.02)
        counter[0] += 1
        t = time.perf_counter()
        if kind.startswith("state"):
            res = svc.run(f"export N={counter[0]}; cd .", session_id=sid)
            assert res.returncode == 0, res
        elif kind.startswith("echo"):
            res = svc.run("echo hi", session_id=sid)
            assert res.stdout == "hi\n", res
        elif kind == "async_echo":
            res = loop.run_until_complete(svc.arun("echo hi", session_id=sid))
            assert res.stdout == "hi\n", res
        else:
            svc.write_file("f.txt", "hello\n", session_id=sid)
            assert svc.read_file("f.txt", session_id=sid) == "hello\n"
        samples.append(time.perf_counter() - t)
    return samples


print(json.dumps({"ready": True}), flush=True)
for line in sys.stdin:
    kind, n = line.split()
    print(json.dumps({"samples": batch(kind, int(n))}), flush=True)
svc.close()
"""


def start(src: str) -> subprocess.Popen[str]:
    env = dict(os.environ, PYTHONPATH=os.path.abspath(src))
    proc = subprocess.Popen(
        [sys.executable, "-c", CHILD],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        env=env,
        text=True,
    )
    assert proc.stdout is not None
    assert json.loads(proc.stdout.readline())["ready"]
    return proc


def ask(proc: subprocess.Popen[str], kind: str, n: int) -> list[float]:
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write(f"{kind} {n}\n")
    proc.stdin.flush()
    return [float(x) for x in json.loads(proc.stdout.readline())["samples"]]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--anchor", required=True, help="the src/ directory to compare against")
    parser.add_argument("--candidate", required=True, help="the src/ directory measured")
    parser.add_argument("--rounds", type=int, default=60)
    parser.add_argument("--batch", type=int, default=10)
    args = parser.parse_args()
    trees = {"anchor": start(args.anchor), "candidate": start(args.candidate)}
    kinds = ("echo", "write+read", "echo_paused", "state", "state_paused", "async_echo")
    results: dict[tuple[str, str], list[float]] = {}
    try:
        for kind in kinds:  # warm-up batch each, not counted
            for proc in trees.values():
                ask(proc, kind, 10)
        for r in range(args.rounds):
            order = list(trees.items()) if r % 2 == 0 else list(trees.items())[::-1]
            for kind in kinds:
                for name, proc in order:
                    results.setdefault((kind, name), []).extend(ask(proc, kind, args.batch))
    finally:
        for proc in trees.values():
            assert proc.stdin is not None
            proc.stdin.close()
            proc.wait(timeout=30)
    load = os.getloadavg()[0]
    print(f"load: {load:.2f} (1 min)  rounds: {args.rounds}  at {time.strftime('%H:%M')}")
    print("| sync call, p50 | anchor | candidate | candidate / anchor |")
    print("|---|---|---|---|")
    for kind in kinds:
        a = statistics.median(results[(kind, "anchor")])
        c = statistics.median(results[(kind, "candidate")])
        print(f"| {kind} | {a * 1e3:.3f} ms | {c * 1e3:.3f} ms | {c / a:.3f}x |")


if __name__ == "__main__":
    main()
