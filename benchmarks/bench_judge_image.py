"""The code judge on an image: Python submissions through the image's own interpreter
(``CodeJudge(image_python=True)``: ``PythonExecutorService(image=...)``) beside a shell
session each (the default), the same image and cache, in one process.

Run: PYTHONPATH=src .venv/bin/python benchmarks/bench_judge_image.py [--rounds 5] [--requests 20]

The image is the Debian 12 rootfs ``.ci/run`` makes (``~/.cache/toolservices-tests/``,
or ``$TOOLSERVICES_TEST_ROOTFS``), else the demo's image (this machine's Python in an OCI
layout, ``toolservices demo``). Per request, one at a time, rounds alternating between
the two judges: p50 wall time, and the CPU time this process and every process it started
spent (the judges' fork servers, sessions, shells, interpreters; reaped ones included),
divided by the requests; then 8 clients at once, requests/s (the judge's concurrency 2,
as on this 2-core machine). A stdin/stdout solution, as in bench_judge.py.
"""

from __future__ import annotations

import argparse
import functools
import os
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "tests" / "images"))

from _util import fmt_time, tree_cpu  # noqa: E402

from toolservices.judge import CodeJudge  # noqa: E402

PY = "a, b = map(int, input().split())\nprint(a + b)\n"
ROOTFS = os.environ.get("TOOLSERVICES_TEST_ROOTFS") or os.path.expanduser(
    "~/.cache/toolservices-tests/debian-bookworm-python.tar"
)


def image_reference(work: str) -> str:
    if os.path.exists(ROOTFS):
        from _build import oci_layout_from_rootfs

        oci_layout_from_rootfs(f"{work}/debian", ROOTFS, [])
        return f"oci:{work}/debian"
    from toolservices.cli._demo_image import build_image

    build_image(f"{work}/demo")
    return f"oci:{work}/demo"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--requests", type=int, default=20, help="per judge and round")
    args = parser.parse_args()
    print(f"cpus: {os.cpu_count()}, load average: {os.getloadavg()}")
    with tempfile.TemporaryDirectory() as work:
        reference = image_reference(work)
        print(f"image: {reference.split('/')[-1]}")
        cache = f"{work}/cache"
        judges = {
            "image python (executor)": CodeJudge(
                concurrency=2, spares=2, image=reference, image_cache=cache, image_python=True
            ),
            "shell session": CodeJudge(concurrency=2, spares=2, image=reference, image_cache=cache),
        }
        try:
            walls: dict[str, list[float]] = {name: [] for name in judges}
            cpus: dict[str, list[float]] = {name: [] for name in judges}
            for judge in judges.values():  # warm: spares ready, first imports done
                for _ in range(3):
                    assert judge.run_code(PY, "python", stdin="1 2")["status"] == "Success"
            rates: dict[str, list[float]] = {name: [] for name in judges}
            for _ in range(args.rounds):
                for name, judge in judges.items():
                    time.sleep(0.5)
                    started = time.perf_counter()
                    call = functools.partial(judge.run_code, PY, "python", stdin="1 2")
                    with ThreadPoolExecutor(8) as pool:
                        done = list(
                            pool.map(
                                lambda _, call=call: call(),
                                range(4 * args.requests),
                            )
                        )
                    rates[name].append(len(done) / (time.perf_counter() - started))
                    assert all(r["status"] == "Success" for r in done), done
                for name, judge in judges.items():
                    time.sleep(0.5)  # the other judge's spares refilled
                    before = tree_cpu(os.getpid())
                    for _ in range(args.requests):
                        started = time.perf_counter()
                        r = judge.run_code(PY, "python", stdin="1 2")
                        walls[name].append(time.perf_counter() - started)
                        assert r["run_result"]["stdout"] == "3\n", r
                    time.sleep(0.5)  # spares the requests used are made again: counted
                    cpus[name].append((tree_cpu(os.getpid()) - before) / args.requests)
        finally:
            for judge in judges.values():
                judge.close()
    print(f"\nPython run_code on an image, one at a time ({args.rounds} x {args.requests})")
    base_wall = statistics.median(walls["shell session"])
    base_cpu = statistics.median(cpus["shell session"])
    for name in judges:
        wall, cpu = statistics.median(walls[name]), statistics.median(cpus[name])
        print(
            f"   {name:<25} p50 {fmt_time(wall):>10} ({wall / base_wall:4.2f}x)   "
            f"CPU/request {fmt_time(cpu):>10} ({cpu / base_cpu:4.2f}x)"
        )
    print(f"\n8 clients at once ({args.rounds} x {4 * args.requests} requests), median requests/s")
    for name in judges:
        rate, base = statistics.median(rates[name]), statistics.median(rates["shell session"])
        print(f"   {name:<25} {rate:7.1f}/s ({rate / base:4.2f}x)")
    print(f"load average after: {os.getloadavg()}")


if __name__ == "__main__":
    main()
