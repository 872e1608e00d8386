"""A small MCP server written with the SDK, for the bridge's tests.

Run over stdio (default) or streamable HTTP: ``demo_server.py --http``
binds 127.0.0.1 on a free port and prints ``PORT <n>`` on stdout once it
listens.
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
import threading
import time
from typing import Any

import anyio
from mcp.server.mcpserver import Context, Image, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from pydantic import BaseModel

server = MCPServer("demo")


async def _exit_soon_after_listing(ctx: Any, call_next: Any) -> Any:
    """With DEMO_EXIT_AFTER_LIST set, die shortly after each tools/list: a crash loop."""
    result = await call_next(ctx)
    if ctx.method == "tools/list":
        threading.Timer(0.2, os._exit, args=(3,)).start()
    return result


if os.environ.get("DEMO_EXIT_AFTER_LIST"):
    server.middleware.append(_exit_soon_after_listing)

# A 1x1 transparent PNG.
PNG = bytes.fromhex(
    "89504e470d0a1a0a0000000d4948445200000001000000010806000000"
    "1f15c4890000000d49444154789c6360000002000154a24f5d0000000049454e44ae426082"
)


class Sum(BaseModel):
    total: int


@server.tool()
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


@server.tool()
def add_structured(a: int, b: int) -> Sum:
    """Add two integers and return structured content."""
    return Sum(total=a + b)


@server.tool()
async def sleep(seconds: float) -> str:
    """Sleep, then say so."""
    await anyio.sleep(seconds)
    return f"slept {seconds}"


# Rendezvous groups of ``meet``: calls that arrived, and the event set when all did.
_groups: dict[str, tuple[list[int], anyio.Event]] = {}


@server.tool()
async def meet(group: str, n: int) -> str:
    """Returns once ``n`` calls of ``group`` run at the same time (gives up after 8 s)."""
    arrived, everyone = _groups.setdefault(group, ([0], anyio.Event()))
    arrived[0] += 1
    if arrived[0] == n:
        everyone.set()
    with anyio.move_on_after(8):
        await everyone.wait()
    return f"met {n}" if everyone.is_set() else f"only {arrived[0]} of {n} arrived"


# Groups of ``park`` calls: the event is set once one of them is running here.
_parked: dict[str, anyio.Event] = {}


@server.tool()
async def park(group: str) -> str:
    """Marks ``group`` as running, then sleeps 30 s: a call to kill or cancel midway."""
    _parked.setdefault(group, anyio.Event()).set()
    await anyio.sleep(30)
    return "parked"


@server.tool()
async def parked(group: str) -> str:
    """'yes' once a ``park`` call of ``group`` runs in this process ('no' after 8 s)."""
    event = _parked.setdefault(group, anyio.Event())
    with anyio.move_on_after(8):
        await event.wait()
    return "yes" if event.is_set() else "no"


@server.tool()
def fail(message: str) -> str:
    """Always fail with the given message."""
    raise ToolError(message)


@server.tool()
def big(n: int) -> str:
    """Return n characters of text."""
    return "x" * n


@server.tool()
def pid() -> int:
    """The server's process id."""
    return os.getpid()


@server.tool()
def getenv(name: str) -> str:
    """An environment variable of the server process ('<unset>' if absent)."""
    return os.environ.get(name, "<unset>")


@server.tool()
def header(name: str, ctx: Context) -> str:
    """An HTTP request header of this call ('<none>' if absent or on stdio)."""
    headers = ctx.headers or {}
    return str(headers.get(name.lower(), "<none>"))


@server.tool()
def client_info(ctx: Context) -> str:
    """How the client introduced itself: 'name version'."""
    params = ctx.session.client_params
    info = params.client_info if params is not None else None
    return f"{info.name} {info.version}" if info is not None else "<unknown>"


@server.tool()
def image() -> Image:
    """A tiny PNG image."""
    return Image(data=PNG, format="png")


async def _serve_http(port: int) -> None:
    import uvicorn

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", port))
    app = server.streamable_http_app()
    config = uvicorn.Config(app, log_level="warning", lifespan="on")
    sock.listen(128)  # accept (queue) connections before announcing the port
    print(f"PORT {sock.getsockname()[1]}", flush=True)
    await uvicorn.Server(config).serve(sockets=[sock])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--http", action="store_true")
    parser.add_argument("--port", type=int, default=0)
    options = parser.parse_args()
    if options.http:
        anyio.run(_serve_http, options.port)
    else:
        server.run("stdio")
        # DEMO_LINGER=<s>: a stubborn server that outlives its stdin, so only
        # the client's SIGTERM/SIGKILL escalation can stop it.
        time.sleep(float(os.environ.get("DEMO_LINGER", "0")))
    sys.exit(0)


if __name__ == "__main__":
    main()
