"""The code judge side by side with SandboxFusion: the same HTTP requests to both.

Run: .venv/bin/python benchmarks/bench_judge.py [--sandbox-fusion URL] [--requests 400]

Starts ``toolservices serve --sandbox-fusion`` (a child process, loopback, a free port)
and, when given, sends the same requests to a SandboxFusion server already running at
URL (how to run one locally: docs/benchmarks.md). Measured, per server:

* Python requests/s with 8 concurrent clients, each request a stdin/stdout solution
  (a new HTTP connection per request, as verl's client makes);
* C++ compile + run, one request at a time: p50 of distinct sources (nothing cached)
  and of one repeated source (our compile cache; SandboxFusion has none);
* 20 test cases of one C++ program: 20 ``/run_code`` calls from 8 clients against one
  ``/run_tests`` call (ours only).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "judge"))
from _server import judge_server  # noqa: E402
from _util import percentile  # noqa: E402

PY = "a, b = map(int, input().split())\nprint(a + b)\n"
CPP = (
    "#include <iostream>\nint main(){long a,b;std::cin>>a>>b;std::cout<<a+b<<std::endl;}\n"
    "// variant {n}\n"
)


def post(url: str, body: dict[str, Any]) -> dict[str, Any]:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST")
    req.add_header("Content-Type", "application/json")
    with urllib.request.urlopen(req, timeout=120) as resp:
        answer: dict[str, Any] = json.loads(resp.read())
    return answer


def python_rps(base: str, n: int, clients: int) -> tuple[float, float, int]:
    """Requests/s, p50 latency and the count of wrong answers, ``clients`` at once."""
    latencies: list[float] = []

    def one(i: int) -> bool:
        started = time.perf_counter()
        r = post(base + "/run_code", {"code": PY, "language": "python", "stdin": f"{i} 1\n"})
        latencies.append(time.perf_counter() - started)
        return r["status"] == "Success" and r["run_result"]["stdout"] == f"{i + 1}\n"

    with ThreadPoolExecutor(clients) as pool:
        list(pool.map(one, range(clients * 2)))  # warm up
        latencies.clear()
        started = time.perf_counter()
        ok = list(pool.map(one, range(n)))
        wall = time.perf_counter() - started
    return n / wall, statistics.median(latencies), ok.count(False)


def cpp_p50(base: str, n: int, *, repeated: bool) -> float:
    samples = []
    for i in range(n + 1):
        code = CPP.replace("{n}", "same" if repeated else f"{time.time_ns()}-{i}")
        started = time.perf_counter()
        r = post(base + "/run_code", {"code": code, "language": "cpp", "stdin": "2 3\n"})
        elapsed = time.perf_counter() - started
        assert r["run_result"]["stdout"] == "5\n", r
        if i:  # the first repeated one compiles
            samples.append(elapsed)
    return percentile(samples, 50)


def cases_20(base: str, *, tests_endpoint: bool) -> float:
    code = CPP.replace("{n}", f"cases-{time.time_ns()}")
    cases = [{"stdin": f"{i} {i}\n", "expected_stdout": f"{2 * i}\n"} for i in range(20)]
    started = time.perf_counter()
    if tests_endpoint:
        r = post(base + "/run_tests", {"code": code, "language": "cpp", "cases": cases})
        assert r["accepted"] == 20, r
    else:
        with ThreadPoolExecutor(8) as pool:
            outs = list(
                pool.map(
                    lambda c: post(
                        base + "/run_code", {"code": code, "language": "cpp", "stdin": c["stdin"]}
                    ),
                    cases,
                )
            )
        assert all(o["run_result"]["stdout"] == c["expected_stdout"] for o, c in zip(outs, cases))
    return time.perf_counter() - started


def measure(name: str, base: str, args: argparse.Namespace, ours: bool) -> dict[str, Any]:
    rps, p50, wrong = python_rps(base, args.requests, 8)
    row: dict[str, Any] = {"server": name, "python_rps": rps, "python_p50": p50, "wrong": wrong}
    row["cpp_p50"] = cpp_p50(base, args.cpp, repeated=False)
    row["cpp_repeat_p50"] = cpp_p50(base, args.cpp, repeated=True)
    row["cases_run_code"] = statistics.median(
        cases_20(base, tests_endpoint=False) for _ in range(3)
    )
    if ours:
        row["cases_run_tests"] = statistics.median(
            cases_20(base, tests_endpoint=True) for _ in range(3)
        )
    print(json.dumps(row), flush=True)
    return row


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sandbox-fusion", metavar="URL", help="a running SandboxFusion")
    parser.add_argument("--requests", type=int, default=400)
    parser.add_argument("--cpp", type=int, default=15)
    parser.add_argument("--concurrency", type=int, default=8)
    args = parser.parse_args()
    print(f"# load average {os.getloadavg()}, {os.cpu_count()} CPUs", flush=True)
    rows = []
    if args.sandbox_fusion:
        rows.append(measure("SandboxFusion", args.sandbox_fusion.rstrip("/"), args, False))
    with judge_server("--concurrency", str(args.concurrency)) as base:
        rows.append(measure("toolservices", base, args, True))
    print(f"# load average {os.getloadavg()}", flush=True)
    if len(rows) == 2:
        sf, us = rows
        print(
            f"# python rps x{us['python_rps'] / sf['python_rps']:.1f}, "
            f"cpp p50 x{sf['cpp_p50'] / us['cpp_p50']:.2f}, "
            f"cpp repeated p50 x{sf['cpp_repeat_p50'] / us['cpp_repeat_p50']:.1f}"
        )


if __name__ == "__main__":
    main()
