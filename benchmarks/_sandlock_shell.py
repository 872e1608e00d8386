"""The sandlock column of bench_shell.py: run by sandlock's own interpreter, prints JSON.

Run: /path/to/venv-with-sandlock/bin/python benchmarks/_sandlock_shell.py N
(bench_shell.py does this with ``--sandlock-python``). sandlock 0.9.0 has no
persistent shell: every command is one sandboxed process (Landlock + seccomp,
seccomp user notification). Prints p50 seconds per measure, or the error.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

FILL = "mkdir -p data && (cd data && for i in $(seq 1000); do head -c 100000 /dev/zero > f$i; done)"
SMALL = "mkdir -p many && (cd many && for i in $(seq 1000); do : > f$i; done)"
READABLE = ["/usr", "/lib", "/lib64", "/bin", "/etc", "/proc", "/dev"]


def p50(fn: Any, n: int, warmup: int = 3) -> float:
    for _ in range(warmup):
        fn()
    samples = []
    for _ in range(n):
        started = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - started)
    return statistics.median(samples)


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 30
    out: dict[str, Any] = {}
    try:
        import sandlock
        from sandlock import BranchAction, Sandbox

        out["version"] = sandlock.__version__
        out["landlock_abi"] = sandlock.landlock_abi_version()
        with tempfile.TemporaryDirectory() as work:

            def box(**extra: Any) -> Any:
                return Sandbox(fs_readable=READABLE, fs_writable=[work, "/tmp"], cwd=work, **extra)

            def check(res: Any) -> None:
                if not res.success:
                    raise RuntimeError(f"sandlock run failed: {res}")

            check(box().run(["bash", "-c", "echo hi"], timeout=30))
            out["create"] = p50(lambda: check(box().run(["bash", "-c", "true"])), n)
            live = box()
            out["echo"] = p50(lambda: check(live.run(["bash", "-c", "echo hi"])), n)
            subprocess.run(["bash", "-c", SMALL], cwd=work, check=True)
            out["ls"] = p50(lambda: check(live.run(["bash", "-c", "ls many"])), n)
        # the nearest thing to fork_session: a copy-on-write branch of a 100 MB workdir
        with tempfile.TemporaryDirectory(dir="/dev/shm") as big:
            subprocess.run(["bash", "-c", FILL], cwd=big, check=True)
            store = tempfile.mkdtemp(dir="/dev/shm")

            def branch() -> None:
                sb = Sandbox(
                    fs_readable=READABLE,
                    workdir=big,
                    cwd=big,
                    fs_storage=store,
                    on_exit=BranchAction.ABORT,
                )
                check(sb.run(["bash", "-c", "ls data | wc -l"]))

            out["fork"] = p50(branch, max(5, n // 6))
            subprocess.run(["rm", "-rf", store], check=False)
    except Exception as exc:  # reported, not raised: the bench prints why the column is empty
        out["error"] = f"{type(exc).__name__}: {exc}"
    print(json.dumps(out))


if __name__ == "__main__":
    main()
