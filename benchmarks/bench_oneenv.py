"""Python in a shell session (``ShellService.run_python``) beside the Python executor.

Run (as root or a user with unprivileged user namespaces):
    PYTHONPATH=src .venv/bin/python benchmarks/bench_oneenv.py [--repeats 30]

All in one process, interleaved per section, p50 of ``--repeats``:

1. A warm call, ``print(1)``: ``ShellService.run_python`` in a session whose interpreter
   runs, beside ``PythonExecutorService.execute`` in a warm session (the anchor) and the
   shell's own ``run("echo 1")``; then both async APIs awaited on the library's loop.
2. The first Python call of a session that exists (its bash has run): the interpreter
   forked from the supervisor, beside a new executor session's first call.
3. On an image (the demo's, built here: this interpreter's base Python and pytest):
   the first Python call of an image shell session (the image's python3 started, the
   runtime zip sent) beside a new ``PythonExecutorService(image=...)`` session's first
   call; then a warm call in each.
4. Memory: PSS per idle episode that used both tools (``--idle`` of them): one shell
   session whose interpreter ran, beside a shell session plus an executor session.
"""

from __future__ import annotations

import argparse
import itertools
import os
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from _util import fmt_time, measure, median  # noqa: E402

from toolservices._portal import run_sync  # noqa: E402
from toolservices.python import PythonExecutorService  # noqa: E402
from toolservices.shell import ShellService  # noqa: E402

_ids = itertools.count()


def _check(result: object) -> None:
    if not getattr(result, "success", False):
        raise RuntimeError(f"a benchmark call failed: {result}")


def _first_calls(
    prepare: Callable[[str], None], call: Callable[[str], object], repeats: int
) -> list[float]:
    """Seconds of ``call(session)`` right after ``prepare(session)``, for fresh sessions."""
    samples = []
    for _ in range(repeats):
        session = f"b{next(_ids)}"
        prepare(session)
        started = time.perf_counter()
        _check(call(session))
        samples.append(time.perf_counter() - started)
    return samples


async def _on_loop(call: Callable[[], Awaitable[object]], repeats: int) -> list[float]:
    """Seconds of ``await call()``, on the library's loop (no thread hop per call)."""
    samples = []
    for index in range(repeats + 3):
        started = time.perf_counter()
        _check(await call())
        if index >= 3:
            samples.append(time.perf_counter() - started)
    return samples


def row(name: str, ours: list[float], anchor: list[float], anchor_name: str) -> None:
    a, b = median(ours), median(anchor)
    print(f"| {name} | {fmt_time(a)} | {anchor_name} {fmt_time(b)} | {a / b:.2f}x |")


def first_call(label: str, shell: ShellService, python: PythonExecutorService, n: int) -> None:
    """The first Python call of a session whose bash ran, beside a new executor session's."""

    def prepare(session: str) -> None:
        _check(shell.run("true", session_id=session))

    ours = _first_calls(prepare, lambda s: shell.run_python("pass", session_id=s), n)
    anchor = _first_calls(lambda s: None, lambda s: python.execute("pass", session_id=s), n)
    row(f"{label}first Python call of a session", ours, anchor, "new executor session")


def warm_calls(
    label: str, shell: ShellService, python: PythonExecutorService, n: int, *, more: bool
) -> None:
    """``print(1)`` in warm sessions (sync; with ``more`` also ``echo 1`` and async)."""
    _check(shell.run_python("pass", session_id="warm"))
    _check(python.execute("pass", session_id="warm"))
    ours = measure(lambda: _check(shell.run_python("print(1)", session_id="warm")), repeats=n)
    anchor = measure(lambda: _check(python.execute("print(1)", session_id="warm")), repeats=n)
    row(f"{label}warm call `print(1)`", ours, anchor, "executor")
    if not more:
        return
    echo = measure(lambda: _check(shell.run("echo 1", session_id="warm")), repeats=n)
    row("(the shell's own `echo 1`)", echo, anchor, "executor")
    ours = run_sync(_on_loop, lambda: shell.arun_python("print(1)", session_id="warm"), n)
    anchor = run_sync(_on_loop, lambda: python.aexecute("print(1)", session_id="warm"), n)
    row("warm call `print(1)`, async on the loop", ours, anchor, "executor")


def memory(n: int) -> None:
    """PSS per episode of ``n`` idle episodes that used both tools: one shell session whose
    interpreter ran (one environment), beside a shell session plus an executor session."""
    from bench_images import _tree_pss

    per: dict[str, float] = {}
    with (
        ShellService(pool_size=2, timeout=30.0, max_sessions=n + 8) as shell,
        PythonExecutorService(pool_size=2, timeout=30.0, max_sessions=n + 8) as python,
    ):
        _check(shell.run_python("pass", session_id="warm"))
        _check(python.execute("pass", session_id="warm"))
        for name in ("one environment", "shell + executor sessions", "shell session alone"):
            before = _tree_pss()
            sessions = [f"{name[:3]}-{i}" for i in range(n)]
            for session in sessions:
                _check(shell.run("true", session_id=session))
                if name == "one environment":
                    _check(shell.run_python("x = 1", session_id=session))
                elif name == "shell + executor sessions":
                    _check(python.execute("x = 1", session_id=session))
            per[name] = (_tree_pss() - before) / n
            for session in sessions:  # the next kind starts from the same place
                shell.close_session(session)
                python.close_session(session)
    one, two, alone = (per[k] / 2**20 for k in per)
    print(
        f"| PSS per idle episode that used both tools, {n} episodes | {one:.2f} MiB "
        f"(the shell session alone: {alone:.2f} MiB) | shell + executor sessions "
        f"{two:.2f} MiB | {one / two:.2f}x |"
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--sections", default="1234")
    parser.add_argument("--idle", type=int, default=32, help="episodes for the PSS figure")
    args = parser.parse_args()
    n = args.repeats
    print(f"load average: {os.getloadavg()}")
    print("| what | ours | anchor | ratio |\n|---|---|---|---|")
    if "1" in args.sections or "2" in args.sections:
        with (
            ShellService(pool_size=2, timeout=30.0) as shell,
            PythonExecutorService(pool_size=2, timeout=30.0) as python,
        ):
            if "1" in args.sections:
                warm_calls("", shell, python, n, more=True)
            if "2" in args.sections:
                first_call("", shell, python, n)
    if "3" in args.sections:
        from toolservices.cli._demo_image import build_image

        with tempfile.TemporaryDirectory() as tmp:
            reference = build_image(os.path.join(tmp, "oci"))
            options = {"pool_size": 2, "timeout": 30.0, "image": reference}
            options["image_cache"] = os.path.join(tmp, "cache")
            with ShellService(**options) as shell, PythonExecutorService(**options) as python:
                first_call("image: ", shell, python, n)
                warm_calls("image: ", shell, python, n, more=False)
    if "4" in args.sections:
        memory(args.idle)
    print(f"load average: {os.getloadavg()}")


if __name__ == "__main__":
    main()
