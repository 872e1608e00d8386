"""Servers over streamable HTTP, and servers that die: detection, clear errors, recovery."""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import Callable
from typing import Any

import anyio
import psutil
import pytest
from tests.mcp._inflight import start_parked

from toolservices.errors import ToolNotFoundError, ToolTimeoutError
from toolservices.mcp import HttpServer, MCPConnectionError, MCPToolset

#: Bound on waits for a failure to surface (the SDK reports a closed pipe in ms).
SURFACE = 10.0


@pytest.mark.usefixtures("no_leftover_processes")
async def test_killed_stdio_server_fails_in_flight_calls_and_is_restarted(
    demo_stdio: Callable[..., dict[str, object]],
) -> None:
    async with MCPToolset({"demo": demo_stdio()}, timeout=15.0, backoff=0.1) as ts:
        pid = int((await ts.acall("demo.pid")).text)
        in_flight = await start_parked(ts)
        os.kill(pid, signal.SIGKILL)
        with pytest.raises(MCPConnectionError, match="closed the connection") as info:
            await asyncio.wait_for(in_flight, SURFACE)  # the hang bound: ms expected
        assert info.value.retryable
        # Later calls wait for the restarted server and succeed.
        assert (await ts.acall("demo.add", {"a": 1, "b": 2})).text == "3"
        new_pid = int((await ts.acall("demo.pid")).text)
        assert new_pid != pid
        assert ts.status()["demo"]["state"] == "ready"
        assert ts.status()["demo"]["restarts"] == 1
    assert not psutil.pid_exists(new_pid) or psutil.Process(new_pid).status() == "zombie"


async def test_http_calls_discovery_and_errors(http_demo_factory: Callable[..., Any]) -> None:
    server = http_demo_factory()
    config = HttpServer(url=server.url, headers={"X-Api-Key": "k123"})
    async with MCPToolset({"demo": config}, timeout=10.0) as ts:
        assert {"demo.add", "demo.sleep", "demo.image"} <= set(ts.names())
        assert (await ts.acall("demo.header", {"name": "X-Api-Key"})).text == "k123"
        assert (await ts.acall("demo.add", {"a": 2, "b": 2})).text == "4"
        assert (await ts.acall("demo.add_structured", {"a": 2, "b": 2})).structured == {"total": 4}
        with pytest.raises(ToolNotFoundError, match="Unknown tool: demo.nope"):
            await ts.acall("demo.nope", {})
        with pytest.raises(ToolTimeoutError):
            await ts.acall("demo.sleep", {"seconds": 30}, timeout=0.3)
        # All fifty are inside the server at once, or none answers "met 50".
        results = await asyncio.gather(
            *(ts.acall("demo.meet", {"group": "http", "n": 50}) for _ in range(50))
        )
        assert [r.text for r in results] == ["met 50"] * 50


async def test_http_server_restarted_on_its_port_is_reconnected(
    http_demo_factory: Callable[..., Any],
) -> None:
    server = http_demo_factory()
    port = server.port
    config = HttpServer(url=server.url)
    async with MCPToolset({"demo": config}, timeout=20.0, backoff=0.1, max_restarts=8) as ts:
        first_pid = int((await ts.acall("demo.pid")).text)
        in_flight = await start_parked(ts)
        server.kill()
        with pytest.raises(MCPConnectionError) as info:
            await asyncio.wait_for(in_flight, SURFACE)
        assert info.value.retryable
        http_demo_factory(port)
        assert (await ts.acall("demo.add", {"a": 5, "b": 5})).text == "10"
        assert int((await ts.acall("demo.pid")).text) != first_pid


async def test_http_server_gone_for_good_gives_up_after_bounded_retries(
    http_demo_factory: Callable[..., Any],
) -> None:
    server = http_demo_factory()
    config = HttpServer(url=server.url)
    async with MCPToolset({"demo": config}, timeout=10.0, backoff=0.05, max_restarts=2) as ts:
        in_flight = await start_parked(ts)
        server.kill()
        with pytest.raises(MCPConnectionError):
            await asyncio.wait_for(in_flight, SURFACE)
        with pytest.raises(MCPConnectionError, match=r"unavailable \(failed\)") as info:
            await ts.acall("demo.add", {"a": 1, "b": 1})
        assert not info.value.retryable
        assert ts.status()["demo"]["state"] == "failed"


@pytest.mark.usefixtures("no_leftover_processes")
async def test_server_that_keeps_dying_is_given_up_after_bounded_restarts(
    demo_stdio: Callable[..., dict[str, object]],
) -> None:
    crashing = demo_stdio(DEMO_EXIT_AFTER_LIST="1")
    async with MCPToolset({"demo": crashing}, timeout=30.0, backoff=0.05, max_restarts=2) as ts:
        # Each connection dies 0.2 s after listing its tools without serving a
        # call, so every restart counts against the budget. No calls are made
        # (one would make its connection healthy); wait for the runner to end.
        runner = ts._connections["demo"]
        assert ts._bridge is not None
        with anyio.fail_after(SURFACE * 3):
            await ts._bridge.arun(runner.done.wait)
        assert ts.status()["demo"]["state"] == "failed"
        assert ts.status()["demo"]["restarts"] == 3  # first connection + 2 restarts, all lost
        with pytest.raises(MCPConnectionError, match=r"unavailable \(failed\)") as info:
            await ts.acall("demo.pid")
        assert not info.value.retryable


async def test_http_server_restarted_while_idle_gets_a_new_session_transparently(
    http_demo_factory: Callable[..., Any],
) -> None:
    server = http_demo_factory()
    async with MCPToolset({"demo": HttpServer(url=server.url)}, timeout=20.0) as ts:
        first_pid = int((await ts.acall("demo.pid")).text)
        server.kill()
        http_demo_factory(server.port)
        # The new server answers our old session id with HTTP 404; the refused
        # call is sent again on a fresh session, so the caller sees no error.
        assert (await ts.acall("demo.add", {"a": 2, "b": 2})).text == "4"
        assert int((await ts.acall("demo.pid")).text) != first_pid
        assert ts.status()["demo"]["restarts"] == 1
