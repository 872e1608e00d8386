"""Our tools served over MCP (stdio and streamable HTTP), used through our own client."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import anyio.lowlevel
import pytest

from toolservices.errors import ToolNotFoundError, ToolTimeoutError
from toolservices.mcp import HttpServer, MCPToolset, StdioServer, aserve
from toolservices.tools import tool

SERVE_TOOLS = str(Path(__file__).parent / "servers" / "serve_tools.py")
WAIT = 20.0


def _check_round_trip(ts: MCPToolset) -> None:
    assert {"ours.multiply", "ours.slow_echo", "ours.explode", "ours.describe"} <= set(ts.names())
    multiply = next(t for t in ts.tools() if t.name == "ours.multiply")
    assert multiply.description == "Multiply two integers."
    assert multiply.schema_in["required"] == ["a", "b"]
    assert ts.call("ours.multiply", {"a": 6, "b": 7}).text == "42"
    described = ts.call("ours.describe", {"values": [1, 2.5]})
    assert described.structured == {"count": 2, "sum": 3.5}
    exploded = ts.call("ours.explode", {"message": "kaboom"})
    # the dispatcher's failure text ("kaboom" or "RuntimeError: kaboom")
    assert exploded.is_error and exploded.text.endswith("kaboom")
    invalid = ts.call("ours.multiply", {"a": "x", "b": 1})
    assert invalid.is_error and "Invalid arguments for tool 'multiply'" in invalid.text
    with pytest.raises(ToolNotFoundError, match="Unknown tool: ours.nope"):
        ts.call("ours.nope", {})
    with pytest.raises(ToolTimeoutError):
        ts.call("ours.slow_echo", {"text": "hi", "seconds": 30}, timeout=0.3)
    assert ts.call("ours.slow_echo", {"text": "hi"}).text == "hi"


@pytest.mark.usefixtures("no_leftover_processes")
def test_serve_stdio_round_trip() -> None:
    with MCPToolset({"ours": StdioServer(command=sys.executable, args=(SERVE_TOOLS,))}) as ts:
        _check_round_trip(ts)


@pytest.fixture
def http_served(announced_server: Callable[..., tuple[subprocess.Popen[str], str]]) -> Any:
    return announced_server([sys.executable, SERVE_TOOLS, "http"])


def test_serve_http_round_trip(http_served: tuple[subprocess.Popen[str], str]) -> None:
    proc, url = http_served
    with MCPToolset({"ours": HttpServer(url=url)}) as ts:
        _check_round_trip(ts)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(WAIT) in (0, -signal.SIGTERM)


async def test_aserve_in_process_with_a_free_port_and_a_tool_timeout() -> None:
    @tool
    def shout(text: str) -> str:
        """Upper-case the text."""
        return text.upper()

    @tool
    async def stall() -> str:
        """Never answers in time."""
        await anyio.sleep(30)
        return "late"

    release = threading.Event()

    @tool
    def block() -> str:
        """A blocking tool that overruns the limit (its thread is abandoned)."""
        release.wait(WAIT)
        return "late"

    ready: list[str] = []
    got_url = anyio.Event()

    def on_ready(url: str) -> None:
        ready.append(url)
        got_url.set()

    async with anyio.create_task_group() as tg:
        tg.start_soon(
            lambda: aserve(
                [shout, stall, block],
                transport="http",
                port=0,
                tool_timeout=0.3,
                on_ready=on_ready,
            )
        )
        with anyio.fail_after(WAIT):
            await got_url.wait()
        async with MCPToolset({"me": HttpServer(url=ready[0])}) as ts:
            assert (await ts.acall("me.shout", {"text": "hi"})).text == "HI"
            stalled = await ts.acall("me.stall")
            assert (
                stalled.is_error
                and stalled.text == "Tool 'stall' timed out after 0.3 s and was abandoned"
            )
            blocked = await ts.acall("me.block")
            release.set()
            assert (
                blocked.is_error
                and blocked.text == "Tool 'block' timed out after 0.3 s and was abandoned"
            )
        tg.cancel_scope.cancel()
    # Cancelling aserve stops uvicorn gracefully: its lifespan task has finished rather
    # than being left pending (to be killed, with a logged traceback, at loop shutdown).
    await anyio.lowlevel.checkpoint()
    pending = [t for t in asyncio.all_tasks() if not t.done() and "Lifespan" in repr(t)]
    assert pending == []
