"""Tools that return what a wire cannot carry as is, served by toolservices.mcp.serve.

``serve_hostile.py [stdio|http] [--grace SECONDS]``; over HTTP it reports its URL on
stderr (``toolservices MCP server ready: <url>``). ``block`` writes ``BLOCKING`` on
stderr when it starts, so a test knows a call is in flight.
"""

from __future__ import annotations

import sys

import anyio

from toolservices.mcp import serve
from toolservices.mcp._server import _announce
from toolservices.tools import tool


@tool
def surrogate_text() -> str:
    """A string with a lone surrogate."""
    return "bad " + chr(0xD800)


@tool
def surrogate_dict() -> dict[str, object]:
    """Structured content with lone surrogates in keys and values."""
    return {"key" + chr(0xDFFF): ["ok", "v" + chr(0xD800)], "n": 1}


@tool
def surrogate_error() -> str:
    """A failure whose message holds a lone surrogate."""
    raise ValueError("boom " + chr(0xDC80))


@tool
async def block() -> str:
    """Never returns on its own (say so on stderr first)."""
    print("BLOCKING", file=sys.stderr, flush=True)
    await anyio.sleep_forever()
    return "unreachable"


if __name__ == "__main__":
    transport = sys.argv[1] if len(sys.argv) > 1 else "stdio"
    grace = float(sys.argv[sys.argv.index("--grace") + 1]) if "--grace" in sys.argv else 5.0
    serve(
        [surrogate_text, surrogate_dict, surrogate_error, block],
        transport=transport,  # type: ignore[arg-type]
        port=0,
        on_ready=_announce,
        shutdown_grace=grace,
    )
