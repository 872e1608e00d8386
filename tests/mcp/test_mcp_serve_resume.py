"""A dropped HTTP event stream is resumed with Last-Event-ID, and the call's result arrives."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable, Iterator
from typing import Any

import httpx2
import mcp.types as mt
import pytest
from tests.mcp._serve_util import POST_HEADERS, WAIT
from tests.mcp.conftest import SERVE_TOOLS

#: The first protocol revision whose clients can resume (they understand priming events).
RESUMABLE = "2025-11-25"


def _events(response: httpx2.Response) -> Iterator[dict[str, Any]]:
    """The SSE events of a streamed response, as dicts of their fields."""
    event: dict[str, Any] = {}
    for line in response.iter_lines():
        if not line:
            if event:
                yield event
            event = {}
            continue
        field, _, value = line.partition(":")
        event[field] = value[1:] if value.startswith(" ") else value


class _Raw:
    """A hand-driven streamable HTTP client (one MCP session)."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.http = httpx2.Client(timeout=httpx2.Timeout(WAIT))
        self.headers = dict(POST_HEADERS)
        self.next_id = 1

    def request(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        """Send a request and return its response (read from the SSE stream)."""
        with self.stream(method, params) as response:
            for event in _events(response):
                if event.get("data"):
                    return dict(json.loads(event["data"]))
        raise AssertionError(f"no answer to {method}")

    def stream(self, method: str, params: dict[str, Any]) -> Any:
        ident, self.next_id = self.next_id, self.next_id + 1
        body = {"jsonrpc": "2.0", "id": ident, "method": method, "params": params}
        return self.http.stream("POST", self.url, json=body, headers=self.headers)

    def open(self) -> None:
        info = {"name": "raw", "version": "1"}
        params = {"protocolVersion": RESUMABLE, "capabilities": {}, "clientInfo": info}
        with self.stream("initialize", params) as response:
            session = response.headers["mcp-session-id"]
            next(e for e in _events(response) if e.get("data"))
        self.headers |= {"mcp-session-id": session, "mcp-protocol-version": RESUMABLE}
        note = {"jsonrpc": "2.0", "method": "notifications/initialized"}
        assert self.http.post(self.url, json=note, headers=self.headers).status_code == 202

    def close(self) -> None:
        self.http.close()


@pytest.fixture
def raw(announced_server: Callable[..., tuple[subprocess.Popen[str], str]]) -> Iterator[_Raw]:
    _, url = announced_server([sys.executable, SERVE_TOOLS, "http"])
    client = _Raw(url)
    client.open()
    try:
        yield client
    finally:
        client.close()


def test_a_dropped_stream_resumes_with_last_event_id(raw: _Raw) -> None:
    # Start a call that waits for the test, and drop its stream after the first event.
    with raw.stream("tools/call", {"name": "wait_for", "arguments": {"gate": "g"}}) as dropped:
        priming = next(_events(dropped))
    assert priming["id"] and priming["retry"] == "1000"
    # The call is still running; let it finish while nobody listens.
    released = raw.request("tools/call", {"name": "release", "arguments": {"gate": "g"}})
    assert released["result"]["content"][0]["text"] == "released"
    # Reconnect where the stream broke: the result is replayed.
    resumed_headers = raw.headers | {"last-event-id": priming["id"], "accept": "text/event-stream"}
    with raw.http.stream("GET", raw.url, headers=resumed_headers) as resumed:
        assert resumed.status_code == 200
        answer = next(json.loads(e["data"]) for e in _events(resumed) if e.get("data"))
    assert answer["id"] == 2  # the wait_for call (initialize was 1)
    assert answer["result"]["content"][0]["text"] == "g passed"


def test_another_session_cannot_replay_the_events(raw: _Raw) -> None:
    with raw.stream("tools/call", {"name": "wait_for", "arguments": {"gate": "h"}}) as dropped:
        priming = next(_events(dropped))
    raw.request("tools/call", {"name": "release", "arguments": {"gate": "h"}})
    other = _Raw(raw.url)
    other.open()
    try:
        headers = other.headers | {"last-event-id": priming["id"], "accept": "text/event-stream"}
        with other.http.stream("GET", other.url, headers=headers) as replay:
            data = [e for e in _events(replay) if e.get("data")]
    finally:
        other.close()
    assert data == []


async def test_the_event_store_keeps_the_newest_events_within_its_bound() -> None:
    from mcp.server.streamable_http import EventMessage

    from toolservices.mcp._events import MemoryEventStore, SessionRef, current_session_ref

    store = MemoryEventStore(max_bytes=1000)
    current_session_ref.set(SessionRef("s"))

    def result(n: int) -> Any:
        return mt.JSONRPCResponse(jsonrpc="2.0", id=n, result={"pad": "x" * 300})

    first = await store.store_event("1", None)
    ids = [await store.store_event("1", result(n)) for n in range(5)]
    assert store.size <= 1000  # the oldest were dropped to stay within the bound
    replayed: list[EventMessage] = []

    async def collect(event: EventMessage) -> None:
        replayed.append(event)

    assert await store.replay_events_after(first, collect) is None  # dropped: nothing to resume
    assert await store.replay_events_after(ids[-2], collect) == "1"
    assert [e.event_id for e in replayed] == [ids[-1]]
    current_session_ref.set(SessionRef("another"))
    assert await store.replay_events_after(ids[-2], collect) is None
