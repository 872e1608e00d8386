"""Launch overhead of each sandbox layer, and the cost of enter_session per session.

Run: ``.venv/bin/python benchmarks/bench_sandbox.py [--repeat N]``

* "server start": ``Popen(plan.argv)`` of a plan whose server is
  ``python -I -S -c pass``, to exit; per level, against the same command
  without any plan (the baseline).
* "plan": ``plan_server_launch`` once its probe is cached (the first call
  per configuration and process also runs the probe launch, reported once).
* "enter_session": a session forked from a warm process, from fork to the end
  of ``enter_session`` (rlimits, no_new_privs, Landlock), against a bare fork;
  in a lean fork server per level, with and without per-session namespaces.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

from toolservices.python.runtime import _confine as session_mod
from toolservices.python.sandbox import SandboxConfig, plan_server_launch

LEVELS = {
    "L3 (bwrap + seccomp + Landlock)": SandboxConfig(),
    "L2 (seccomp + Landlock)": SandboxConfig(bwrap=False),
    "L1 (rlimits, uid)": SandboxConfig(bwrap=False, seccomp=False, landlock=False),
}


def _median_ms(samples: list[float]) -> float:
    return statistics.median(samples) * 1000


def _start_once(config: SandboxConfig | None) -> tuple[float, float, str]:
    """(plan time, server start time, level); config None = no sandbox at all."""
    argv = ["-I", "-S", "-c", "pass"]
    if config is None:
        t = time.perf_counter()
        subprocess.run([sys.executable, *argv], check=True)
        return 0.0, time.perf_counter() - t, "-"
    t = time.perf_counter()
    plan = plan_server_launch(config, argv=argv)
    planned = time.perf_counter() - t
    try:
        t = time.perf_counter()
        subprocess.run(plan.argv, env=plan.env, check=True, start_new_session=True)
        return planned, time.perf_counter() - t, plan.level
    finally:
        plan.close()


def bench_start(repeat: int) -> None:
    """Interleaved (one round over every level per repeat) so load drifts hit all alike."""
    configs: dict[str, SandboxConfig | None] = {"no sandbox (python -I -S -c pass)": None}
    configs.update(LEVELS)
    first = {}
    for name, config in configs.items():  # first call per configuration runs the probe
        t = time.perf_counter()
        _start_once(config)
        first[name] = time.perf_counter() - t
    plans: dict[str, list[float]] = {name: [] for name in configs}
    starts: dict[str, list[float]] = {name: [] for name in configs}
    levels = {}
    for _ in range(repeat):
        for name, config in configs.items():
            planned, started, levels[name] = _start_once(config)
            plans[name].append(planned)
            starts[name].append(started)
    base_ms = _median_ms(starts["no sandbox (python -I -S -c pass)"])
    for name in configs:
        start_ms = _median_ms(starts[name])
        print(
            f"{'server start, ' + name + ' -> ' + levels[name]:58s} {start_ms:7.1f} ms"
            f"  (+{start_ms - base_ms:.1f} ms, x{start_ms / base_ms:.2f})"
        )
        if configs[name] is not None:
            print(
                f"{'  plan_server_launch (probe cached) / first call':58s} "
                f"{_median_ms(plans[name]):7.1f} ms / {first[name] * 1000:.0f} ms"
            )


def _fork_samples(repeat: int, enter: bool, workdir: str) -> tuple[list[float], list[float]]:
    """(fork to child's first byte, enter_session as timed inside the child)."""
    samples, inside = [], []
    for _ in range(repeat):
        read_fd, write_fd = os.pipe()
        t = time.perf_counter()
        pid = os.fork()
        if pid == 0:
            if enter:
                session_mod.enter_session(workdir=workdir)
            os.write(write_fd, repr(session_mod.last_enter_seconds).encode())
            os._exit(0)
        inside.append(float(os.read(read_fd, 64)))
        samples.append(time.perf_counter() - t)
        os.waitpid(pid, 0)
        os.close(read_fd)
        os.close(write_fd)
    return samples, inside


def bench_enter(repeat: int) -> None:
    from toolservices.python.sandbox._planner import _DEVICES

    workdir = tempfile.mkdtemp(prefix="bench-sbx-")
    ro = ["/usr", "/etc/ld.so.cache", sys.base_prefix, sys.prefix, "/proc"]
    state = {
        "level": "L2",
        "rlimits": {"AS": 4 << 30, "CPU": 600, "FSIZE": 64 << 20, "NOFILE": 256, "CORE": 0},
        "landlock": {
            "abi": session_mod.landlock_abi(),
            "read": ro,
            "write": [],
            "devices": list(_DEVICES),
            "deny_tcp": True,
            "scope": True,
        },
        "seccomp_program": None,
    }
    os.environ[session_mod.STATE_ENV] = json.dumps(state)
    session_mod._state_cache = None
    session_mod._load_state()
    try:
        bare = _median_ms(_fork_samples(repeat, False, workdir)[0])
        walls, inside = _fork_samples(repeat, True, workdir)
        entered = _median_ms(walls)
    finally:
        del os.environ[session_mod.STATE_ENV]
        os.rmdir(workdir)
    print(f"{'fork of a warm process (to first byte)':58s} {bare:7.2f} ms")
    print(
        f"{'fork + enter_session (rlimits, NNP, Landlock)':58s}"
        f" {entered:7.2f} ms  (+{entered - bare:.2f} ms)"
    )
    print(f"{'  enter_session itself, timed inside the session':58s} {_median_ms(inside):7.2f} ms")


def bench_enter_in_server(repeat: int) -> None:
    """enter_session as timed inside sessions forked by a lean server under each plan."""
    from toolservices.python.sandbox._snippets import run_snippets

    code = "import _toolservices_runtime._confine as s; print(s.last_enter_seconds)"
    for config in LEVELS.values():
        # with and without per-session namespaces (own user/mount/IPC ns, two tmpfs mounts)
        for own_ns in (True, False):
            variant = dataclasses.replace(config, session_namespaces=own_ns)
            snippets = {f"s{i}": {"code": code} for i in range(repeat)}
            report, results = run_snippets(variant, snippets)
            times = [float(r["output"].split()[-1]) for r in results.values()]
            active = report["layers"]["session_namespaces"]["active"]
            label = f"enter_session in a lean fork server, {report['level']}" + (
                " + session namespaces" if active else ""
            )
            print(f"{label:58s} {_median_ms(times):7.2f} ms")


def bench_fresh_runs(repeat: int) -> None:
    """Fresh-interpreter print(1) with no spare ready, with and without session namespaces.

    Interleaved rounds of 30 calls per variant; the median of round medians. This is
    the full price of a new interpreter: fork, enter_session, the call, and the
    kill of the previous one (in the background), where namespaces also cost teardown.
    """
    from toolservices.python import PythonExecutorService

    services = {
        own_ns: PythonExecutorService(
            pool_size=1, spares=0, sandbox=SandboxConfig(session_namespaces=own_ns)
        )
        for own_ns in (True, False)
    }
    rounds: dict[bool, list[float]] = {True: [], False: []}
    try:
        for svc in services.values():
            svc.execute("pass")
        for _ in range(max(3, repeat // 3)):
            for own_ns, svc in services.items():
                samples = []
                for _ in range(30):
                    start = time.perf_counter()
                    svc.execute("print(1)")
                    samples.append(time.perf_counter() - start)
                rounds[own_ns].append(statistics.median(samples))
    finally:
        for svc in services.values():
            svc.close()
    for own_ns in (True, False):
        label = "fresh print(1), no spare, " + ("with" if own_ns else "without")
        print(f"{label + ' session namespaces':58s} {_median_ms(rounds[own_ns]):7.2f} ms")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=15)
    args = parser.parse_args()
    print(f"uid {os.getuid()}, median of {args.repeat}")
    bench_start(args.repeat)
    bench_enter(args.repeat * 4)
    bench_enter_in_server(args.repeat * 2)
    bench_fresh_runs(args.repeat)


if __name__ == "__main__":
    main()
