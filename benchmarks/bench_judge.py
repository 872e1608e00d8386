"""The code judge side by side with SandboxFusion: the same HTTP requests to both.

Run: .venv/bin/python benchmarks/bench_judge.py [--sandbox-fusion URL] [--requests 200]

Starts ``toolservices serve --sandbox-fusion`` (a child process, loopback, a free port)
and, when given, sends the same requests to a SandboxFusion server already running at
URL (how to run one locally: docs/benchmarks.md). Measured, per server:

Every measure alternates between the servers, round by round (``--rounds``), and the
medians over the rounds are reported, so that both see the same load.

* Python requests/s with 8 concurrent clients, each request a stdin/stdout solution
  (a new HTTP connection per request, as verl's client makes), and the CPU time the
  server and every process it started spent per request (less dependent on the load
  other work puts on the machine than requests/s);
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
from urllib.parse import urlsplit

import psutil

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "judge"))
from _server import judge_server  # noqa: E402
from _util import percentile, tree_cpu  # noqa: E402

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


def server_pid(base: str) -> int:
    """The process listening on ``base``'s port (this machine)."""
    port = urlsplit(base).port
    for conn in psutil.net_connections(kind="tcp"):
        listening = conn.status == psutil.CONN_LISTEN and conn.laddr and conn.laddr.port == port
        if listening and conn.pid is not None:
            return conn.pid
    raise RuntimeError(f"no process listens on {base}")


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
        assert all(
            o["run_result"]["stdout"] == c["expected_stdout"]
            for o, c in zip(outs, cases, strict=True)
        )
    return time.perf_counter() - started


def side_by_side(servers: dict[str, str], args: argparse.Namespace) -> dict[str, dict[str, Any]]:
    """Each measure alternates between the servers, round by round, so both see the same load."""
    rows: dict[str, dict[str, Any]] = {name: {"server": name} for name in servers}
    samples: dict[str, dict[str, list[float]]] = {name: {} for name in servers}

    def add(name: str, key: str, value: float) -> None:
        samples[name].setdefault(key, []).append(value)

    for _ in range(args.rounds):
        for name, base in servers.items():
            pid = server_pid(base)
            cpu = tree_cpu(pid)
            rps, p50, wrong = python_rps(base, args.requests, 8)
            # the warm-up requests count too: 16 of them
            add(name, "python_cpu_ms", (tree_cpu(pid) - cpu) * 1e3 / (args.requests + 16))
            add(name, "python_rps", rps)
            add(name, "python_p50", p50)
            assert wrong == 0, f"{name}: {wrong} wrong answers"
        for name, base in servers.items() if not args.python_only else ():
            add(name, "cpp_p50", cpp_p50(base, args.cpp, repeated=False))
            add(name, "cpp_repeat_p50", cpp_p50(base, args.cpp, repeated=True))
            add(name, "cases_run_code", cases_20(base, tests_endpoint=False))
            if name == "toolservices":
                add(name, "cases_run_tests", cases_20(base, tests_endpoint=True))
    for name in servers:
        for key, values in samples[name].items():
            rows[name][key] = statistics.median(values)
        print(json.dumps(rows[name]), flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sandbox-fusion", metavar="URL", help="a running SandboxFusion")
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--cpp", type=int, default=15)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=3, help="alternations of the servers")
    parser.add_argument("--python-only", action="store_true", help="only the Python measures")
    args = parser.parse_args()
    print(f"# load average {os.getloadavg()}, {os.cpu_count()} CPUs", flush=True)
    with judge_server("--concurrency", str(args.concurrency)) as base:
        servers = {"toolservices": base}
        if args.sandbox_fusion:
            servers["SandboxFusion"] = args.sandbox_fusion.rstrip("/")
        rows = side_by_side(servers, args)
    print(f"# load average {os.getloadavg()}", flush=True)
    if len(rows) == 2:
        us, sf = rows["toolservices"], rows["SandboxFusion"]
        line = (
            f"# python rps x{us['python_rps'] / sf['python_rps']:.1f}, "
            f"python CPU per request x{sf['python_cpu_ms'] / us['python_cpu_ms']:.1f}"
        )
        if not args.python_only:
            line += (
                f", cpp p50 x{sf['cpp_p50'] / us['cpp_p50']:.2f}, "
                f"cpp repeated p50 x{sf['cpp_repeat_p50'] / us['cpp_repeat_p50']:.1f}"
            )
        print(line)


if __name__ == "__main__":
    main()
