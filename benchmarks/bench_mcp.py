"""MCP bridge: connection, per-call latency and concurrency against a real stdio server.

Run: .venv/bin/python benchmarks/bench_mcp.py

The server is the SDK-written demo server of the test suite
(tests/mcp/servers/demo_server.py) over stdio. Reports medians of: connect
(spawn + initialize + tools/list), one ``add`` call through the sync API,
through the async API, and through the Dispatcher; and the wall time of 50
``sleep(0.2)`` calls issued concurrently on one session vs one after another.

TorchRL 0.14.1's MCPToolTransform is not timed side by side: with the mcp 2.x
SDK its tools/list fails ("Invalid request parameters") and every call
returns "MCP server 'demo' not connected", so there is nothing to compare.
"""

from __future__ import annotations

import asyncio
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from _util import fmt_time, measure  # noqa: E402

from toolservices import Dispatcher, ToolCall, ToolRegistry  # noqa: E402
from toolservices.mcp import MCPToolset  # noqa: E402

DEMO = str(Path(__file__).resolve().parent.parent / "tests" / "mcp" / "servers" / "demo_server.py")
SERVERS = {"demo": {"command": sys.executable, "args": [DEMO]}}


async def _raw_sdk_latency(repeats: int = 200) -> list[float]:
    """The floor: the SDK's own session, called from the loop that owns it."""
    from mcp import ClientSession, StdioServerParameters, stdio_client

    params = StdioServerParameters(command=sys.executable, args=[DEMO])
    samples = []
    async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
        await session.initialize()
        for _ in range(repeats + 3):
            started = time.perf_counter()
            await session.call_tool("add", {"a": 1, "b": 2})
            samples.append(time.perf_counter() - started)
    return samples[3:]


def main() -> None:
    connects = []
    for _ in range(3):
        ts = MCPToolset(SERVERS)
        started = time.perf_counter()
        ts.connect()
        connects.append(time.perf_counter() - started)
        ts.close()
    print(
        f"connect (spawn + initialize + list), median of 3: {fmt_time(statistics.median(connects))}"
    )

    raw = asyncio.run(_raw_sdk_latency())
    print(f"one call, raw SDK session (floor): median {fmt_time(statistics.median(raw))}")

    with MCPToolset(SERVERS, timeout=30.0) as ts:
        sync = measure(lambda: ts.call("demo.add", {"a": 1, "b": 2}), repeats=200)
        print(f"one call, sync API:       median {fmt_time(statistics.median(sync))}")

        async def one() -> None:
            await ts.acall("demo.add", {"a": 1, "b": 2})

        loop = asyncio.new_event_loop()
        try:
            asynchronous = measure(lambda: loop.run_until_complete(one()), repeats=200)
        finally:
            loop.close()
        print(f"one call, async API:      median {fmt_time(statistics.median(asynchronous))}")

        registry = ToolRegistry()
        ts.register_into(registry)
        dispatcher = Dispatcher(registry, timeout=30.0)
        batch = [[ToolCall("demo.add", {"a": 1, "b": 2})]]
        dispatched = measure(lambda: dispatcher.run(batch), repeats=200)
        print(f"one call, Dispatcher.run: median {fmt_time(statistics.median(dispatched))}")

        pause, n = 0.2, 50
        calls = [[ToolCall("demo.sleep", {"seconds": pause})] for _ in range(n)]
        started = time.perf_counter()
        dispatcher.run(calls)
        concurrent = time.perf_counter() - started
        started = time.perf_counter()
        for _ in range(10):
            ts.call("demo.sleep", {"seconds": pause})
        serial = (time.perf_counter() - started) * n / 10
        print(
            f"{n} x sleep({pause}) on one session: concurrent {fmt_time(concurrent)}, "
            f"serial (extrapolated from 10) {fmt_time(serial)}, ratio {serial / concurrent:.1f}x"
        )


if __name__ == "__main__":
    main()
