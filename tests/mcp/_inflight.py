"""A demo-server call known to be running in the server, for kill and cancel tests."""

from __future__ import annotations

import asyncio
import uuid

from toolservices.mcp import MCPResult, MCPToolset


async def start_parked(ts: MCPToolset) -> asyncio.Future[MCPResult]:
    """A ``demo.park`` call (30 s) that the server has started, still in flight.

    ``demo.parked`` answers once the server runs the call: an event, not a
    guess that some fixed pause was long enough for the request to get there.
    """
    group = uuid.uuid4().hex
    task = asyncio.ensure_future(ts.acall("demo.park", {"group": group}))
    assert (await ts.acall("demo.parked", {"group": group})).text == "yes"
    assert not task.done()
    return task
