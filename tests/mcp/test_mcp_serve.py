"""Our tools served over MCP (stdio and streamable HTTP), used through our own client."""

from __future__ import annotations

import asyncio
import base64
import os
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

from toolservices.errors import ToolNotFoundError, ToolTimeoutError, UserError
from toolservices.mcp import (
    Audio,
    HttpServer,
    Image,
    MCPToolset,
    Resource,
    ResourceLink,
    StdioServer,
    aserve,
)
from toolservices.tools import tool

SERVE_TOOLS = str(Path(__file__).parent / "servers" / "serve_tools.py")
WAIT = 20.0


def _stdio_serve_tools() -> StdioServer:
    # PYTHONPATH passes through so a source checkout's server is the one tested.
    env = {k: v for k, v in os.environ.items() if k == "PYTHONPATH"}
    return StdioServer(command=sys.executable, args=(SERVE_TOOLS,), env=env)


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
    with MCPToolset({"ours": _stdio_serve_tools()}) as ts:
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


@pytest.mark.usefixtures("no_leftover_processes")
def test_served_tools_return_images_audio_and_resources() -> None:
    sys.path.insert(0, str(Path(SERVE_TOOLS).parent))
    try:
        from serve_tools import PNG, WAV
    finally:
        sys.path.pop(0)
    with MCPToolset({"ours": _stdio_serve_tools()}) as ts:
        result = ts.call("ours.media")
        picture = ts.call("ours.picture")
    assert [p.type for p in result.parts] == [
        "text",
        "image",
        "audio",
        "resource",
        "resource",
        "resource_link",
    ]
    assert result.contents() == [
        "here you are",
        Image(data=PNG, mime_type="image/png"),
        Audio(data=WAV, mime_type="audio/wav"),
        Resource(uri="file:///notes.txt", text="some notes", mime_type="text/plain"),
        Resource(uri="file:///blob.bin", data=b"\x00\x01", mime_type="application/octet-stream"),
        ResourceLink(uri="file:///big.csv", name="big.csv", mime_type="text/csv"),
    ]
    assert result.parts[1].raw["data"] == base64.b64encode(PNG).decode()  # base64 on the wire
    assert str(result).splitlines() == [
        "here you are",
        "[image: image/png]",
        "[audio: audio/wav]",
        "[resource: file:///notes.txt]",
        "[resource: file:///blob.bin]",
        "[resource_link: file:///big.csv]",
    ]
    assert picture.contents() == [Image(data=PNG, mime_type="image/png")]


def test_media_values_render_as_placeholders_and_need_one_payload() -> None:
    assert str(Image(data=b"abc", mime_type="image/png")) == "[image: image/png, 3 bytes]"
    with pytest.raises(UserError, match="exactly one of 'text' or 'data'"):
        Resource(uri="file:///x")
