"""Helpers for the tests of our MCP server: real servers, the SDK's own client, real processes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, TextIO

import anyio
import httpx2
import psutil
from mcp import ClientSession, StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client

CLI = str(Path(sys.executable).parent / "toolservices")
HOSTILE = str(Path(__file__).parent / "servers" / "serve_hostile.py")
#: Bound on every wait of these tests (a loaded 2-core machine is slow, never this slow).
WAIT = 30.0
#: A raw ``initialize`` request, for tests that speak HTTP without the SDK client.
INITIALIZE = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {
        "protocolVersion": "2025-06-18",
        "capabilities": {},
        "clientInfo": {"name": "raw-test", "version": "1"},
    },
}
#: The headers a streamable HTTP POST needs.
POST_HEADERS = {"accept": "application/json, text/event-stream", "content-type": "application/json"}


@asynccontextmanager
async def stdio_session(
    argv: Sequence[str], *, errlog: TextIO | None = None
) -> AsyncIterator[ClientSession]:
    """The SDK's client on a server it starts over stdio, initialised (bounded)."""
    params = StdioServerParameters(command=argv[0], args=list(argv[1:]), env=dict(os.environ))
    async with (
        stdio_client(params, errlog=errlog or sys.stderr) as (read, write),
        ClientSession(read, write, read_timeout_seconds=WAIT) as session,
    ):
        with anyio.fail_after(WAIT):
            await session.initialize()
        yield session


@asynccontextmanager
async def http_session(
    url: str, *, terminate: bool = True, token: str | None = None
) -> AsyncIterator[ClientSession]:
    """The SDK's client on a streamable HTTP server, initialised (bounded).

    Leaving the block ends the MCP session (the client sends DELETE), unless
    ``terminate`` is False: then the client just vanishes. ``token`` is sent
    as ``Authorization: Bearer``.
    """
    headers = {"Authorization": f"Bearer {token}"} if token is not None else None
    client = httpx2.AsyncClient(timeout=httpx2.Timeout(WAIT, read=None), headers=headers)
    async with (
        client,
        streamable_http_client(url, http_client=client, terminate_on_close=terminate) as (
            read,
            write,
        ),
        ClientSession(read, write, read_timeout_seconds=WAIT) as session,
    ):
        with anyio.fail_after(WAIT):
            await session.initialize()
        yield session


async def call(session: ClientSession, tool: str, **arguments: Any) -> Any:
    """One ``tools/call``, bounded; returns the SDK's ``CallToolResult``."""
    with anyio.fail_after(WAIT):
        return await session.call_tool(tool, arguments)


async def run(
    session: ClientSession, code: str, session_id: str | None = "shared"
) -> dict[str, Any]:
    """``python_execute`` that must succeed as a tool call; its structured result."""
    arguments: dict[str, Any] = {"code": code}
    if session_id is not None:
        arguments["session_id"] = session_id
    result = await call(session, "python_execute", **arguments)
    assert not result.is_error, result.content[0].text
    return dict(result.structured_content or {})


#: A session's interpreter marks itself with this niceness (a kernel fact the test can see),
#: so its processes can be told from the executor's fork server and spares.
MARK = "import os; os.nice(11)"


def raised_niceness(increment: int) -> int:
    """The niceness a process started from this one has after ``os.nice(increment)``.

    Relative to the niceness the test run inherited (``nice pytest`` starts at 10),
    capped at 19 as the kernel caps it.
    """
    return min(19, os.nice(0) + increment)


def marked(pid: int) -> int:
    """How many of the server's processes carry the session mark."""
    count = 0
    for child in descendants(pid):
        try:
            count += psutil.Process(child).nice() == raised_niceness(11)
        except psutil.NoSuchProcess:
            continue
    return count


async def wait_unmarked(pid: int) -> bool:
    """Whether the server's marked interpreters all went within the bound."""
    return await anyio.to_thread.run_sync(lambda: wait_until(lambda: marked(pid) == 0))


def descendants(pid: int) -> set[int]:
    """Live (non-zombie) descendants of ``pid``."""
    try:
        children = psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return set()
    alive = set()
    for child in children:
        try:
            if child.status() != psutil.STATUS_ZOMBIE:
                alive.add(child.pid)
        except psutil.NoSuchProcess:
            continue
    return alive


def wait_until(condition: Callable[[], bool], *, within: float = WAIT) -> bool:
    """Whether ``condition`` became true within ``within`` seconds (checked every 50 ms)."""
    deadline = time.monotonic() + within
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def start_server(argv: Sequence[str]) -> tuple[subprocess.Popen[str], str]:
    """Start an HTTP server that announces ``... ready: URL`` on stderr; (process, URL).

    The process has its own group; the caller stops it (see :func:`kill_group`).
    """
    import selectors

    proc = subprocess.Popen(list(argv), stderr=subprocess.PIPE, text=True, start_new_session=True)
    assert proc.stderr is not None
    with selectors.DefaultSelector() as sel:
        sel.register(proc.stderr, selectors.EVENT_READ)
        ready = sel.select(WAIT)
    line = proc.stderr.readline() if ready else ""
    if "ready: http" not in line:
        kill_group(proc)
        raise AssertionError(f"server did not announce itself: {line!r}")
    return proc, line.split("ready: ")[1].strip()


def kill_group(proc: subprocess.Popen[str]) -> None:
    """SIGKILL the process group of a server started by a test (idempotent)."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait(WAIT)
    if proc.stderr is not None:
        proc.stderr.close()
