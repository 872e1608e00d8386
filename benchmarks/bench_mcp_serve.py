"""Our MCP server: what the result escape costs, a call's round trip, and a signalled stop.

* ``escape_result`` alone on typical results (the price of "every string is valid
  Unicode"), medians of 2000;
* one ``tools/call`` over stdio to ``tests/mcp/servers/serve_tools.py`` with the SDK's
  own client session (a text result and a dict result), medians of 300;
* SIGTERM to an idle HTTP server with one connected client, until the process has
  exited, median of 5.

``--baseline PATH`` runs the servers from another checkout's ``src`` (for example
``git archive <commit> src | tar -x -C /tmp/old``) to compare before and after.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import anyio
from _util import fmt_time, measure, median
from mcp import ClientSession, StdioServerParameters, stdio_client

from toolservices.dispatch import value_text
from toolservices.mcp._result import escape_result
from toolservices.mcp._server import _result

ROOT = Path(__file__).resolve().parent.parent
SERVE_TOOLS = str(ROOT / "tests" / "mcp" / "servers" / "serve_tools.py")


def bench_escape() -> None:
    python_result = {
        "success": True,
        "stdout": "x" * 1000 + "\n",
        "stderr": "",
        "returncode": 0,
        "exception": None,
        "duration": 0.01,
        "timed_out": False,
        "truncated": False,
        "restarted": False,
        "session_id": "s1",
    }
    cases = {
        "python result, ASCII": python_result,
        "python result, accented text": {**python_result, "stdout": "é" * 1000},
        "python result, a lone surrogate": {**python_result, "stderr": "\ud800"},
        "short text": "42",
    }
    for name, value in cases.items():
        text = value_text(value)
        built = measure(lambda v=value, t=text: _result(v, t), repeats=2000)  # type: ignore[misc]
        escaped = measure(
            lambda v=value, t=text: escape_result(_result(v, t)),  # type: ignore[misc]
            repeats=2000,
        )
        extra = median(escaped) - median(built)
        print(
            f"escape, {name}: build {fmt_time(median(built))}, "
            f"build + escape {fmt_time(median(escaped))} (+{fmt_time(max(extra, 0.0))})"
        )


async def _round_trips(env: dict[str, str], repeats: int = 300) -> dict[str, float]:
    params = StdioServerParameters(command=sys.executable, args=[SERVE_TOOLS], env=env)
    out = {}
    async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
        await session.initialize()
        for tool, args in (("multiply", {"a": 6, "b": 7}), ("describe", {"values": [1, 2.5]})):
            samples = []
            for _ in range(repeats + 5):
                started = time.perf_counter()
                await session.call_tool(tool, args)
                samples.append(time.perf_counter() - started)
            out[tool] = median(samples[5:])
    return out


def _stop_time(env: dict[str, str]) -> float:
    proc = subprocess.Popen(
        [sys.executable, SERVE_TOOLS, "http"],
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        start_new_session=True,
    )
    assert proc.stderr is not None
    url = proc.stderr.readline().split("ready: ")[1].strip()

    async def connected() -> float:
        from mcp.client.streamable_http import streamable_http_client

        async with (
            streamable_http_client(url) as (read, write),
            ClientSession(read, write) as session,
        ):
            await session.initialize()
            await session.call_tool("multiply", {"a": 1, "b": 2})
            started = time.perf_counter()
            proc.send_signal(signal.SIGTERM)
            await anyio.to_thread.run_sync(proc.wait, 60)
            return time.perf_counter() - started

    try:
        return anyio.run(connected)
    except Exception:  # the old server may break the client's session as it stops
        return float("nan")
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        proc.stderr.close()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--baseline", help="another checkout's src directory to compare with")
    args = parser.parse_args()
    bench_escape()
    setups = {"this checkout": dict(os.environ)}
    if args.baseline:
        setups["baseline"] = {**os.environ, "PYTHONPATH": args.baseline}
    for label, env in setups.items():
        trips = anyio.run(_round_trips, env)
        print(
            f"{label}: one call over stdio, text result {fmt_time(trips['multiply'])}, "
            f"dict result {fmt_time(trips['describe'])}"
        )
    for label, env in setups.items():
        stops = [_stop_time(env) for _ in range(5)]
        print(
            f"{label}: SIGTERM to exit, idle HTTP server with a client: {fmt_time(median(stops))}"
        )


if __name__ == "__main__":
    main()
