"""A bounded in-memory event store, so a dropped HTTP event stream can be resumed.

With an event store the SDK gives every SSE event an id (and a ``retry``
hint); a client whose stream broke during a long call reconnects with
``Last-Event-ID`` and is sent what it missed, the call's result included.
Without one, a result whose stream dropped was lost.

The SDK shares one store between all MCP sessions, and its stream ids are the
requests' JSON-RPC ids, which repeat from session to session. So every event
is kept with the MCP session it belongs to (learnt by :class:`HttpFront
<toolservices.mcp._http.HttpFront>` from the request, through a context
variable that the session's own task inherits), and a replay only ever sends
events of the replaying request's own session.

Memory is bounded by ``max_bytes`` of serialised messages (and
:data:`MAX_EVENTS` events): the oldest events go first. A client that
reconnects after its events were dropped gets nothing replayed.
"""

from __future__ import annotations

import collections
import itertools
from contextvars import ContextVar
from dataclasses import dataclass

import mcp.types as mt
from mcp.server.streamable_http import EventCallback, EventId, EventMessage, EventStore, StreamId

__all__ = ["MAX_EVENTS", "MemoryEventStore", "SessionRef", "current_session_ref"]

#: Most events kept, whatever their size (priming events are nearly empty).
MAX_EVENTS = 100_000


class SessionRef:
    """The MCP session a request belongs to; filled in for the request that opens one."""

    __slots__ = ("session",)

    def __init__(self, session: str | None) -> None:
        self.session = session


#: Set by the HTTP front for each request; inherited by a new session's own task.
current_session_ref: ContextVar[SessionRef | None] = ContextVar(
    "toolservices_mcp_session_ref", default=None
)


@dataclass(frozen=True, slots=True)
class _Event:
    number: int
    stream: StreamId
    owner: SessionRef | None
    data: bytes | None  # the message as JSON (None: a priming event)


class MemoryEventStore(EventStore):
    """Events of every session, the oldest dropped beyond ``max_bytes`` (see the module)."""

    def __init__(self, *, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.size = 0
        self._events: collections.deque[_Event] = collections.deque()
        self._by_id: dict[EventId, _Event] = {}
        self._numbers = itertools.count(1)

    async def store_event(self, stream_id: StreamId, message: mt.JSONRPCMessage | None) -> EventId:
        data = None
        if message is not None:
            data = message.model_dump_json(by_alias=True, exclude_unset=True).encode()
        event = _Event(next(self._numbers), stream_id, current_session_ref.get(), data)
        event_id = str(event.number)
        self._events.append(event)
        self._by_id[event_id] = event
        self.size += len(data or b"")
        while self._events and (self.size > self.max_bytes or len(self._events) > MAX_EVENTS):
            old = self._events.popleft()
            del self._by_id[str(old.number)]
            self.size -= len(old.data or b"")
        return event_id

    async def replay_events_after(
        self, last_event_id: EventId, send_callback: EventCallback
    ) -> StreamId | None:
        last = self._by_id.get(last_event_id)
        asking = current_session_ref.get()
        if last is None or not _same_session(last.owner, asking):
            return None
        missed = [
            e
            for e in list(self._events)
            if e.number > last.number
            and e.stream == last.stream
            and e.data is not None
            and _same_session(e.owner, asking)
        ]
        for event in missed:
            assert event.data is not None
            message = mt.jsonrpc_message_adapter.validate_json(event.data, by_name=False)
            await send_callback(EventMessage(message, str(event.number)))
        return last.stream


def _same_session(owner: SessionRef | None, asking: SessionRef | None) -> bool:
    return (
        owner is not None
        and asking is not None
        and owner.session is not None
        and owner.session == asking.session
    )
