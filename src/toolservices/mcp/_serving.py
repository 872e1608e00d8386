"""What the MCP server and its transports share (``_server``, ``_stdio``, ``_http``).

The calls in flight and their drain, the connection and namespace a tool call
came with, and the signal watch. Kept apart from ``_server`` so that the
transports, which ``aserve`` starts, do not import the module that imports
them.
"""

from __future__ import annotations

import signal
from contextvars import ContextVar

import anyio

__all__ = [
    "CANCEL_SETTLE_TIMEOUT",
    "NAMESPACE_SCOPE_KEY",
    "current_connection",
    "current_namespace",
    "wait_for_signals",
]

_CONNECTION: ContextVar[str | None] = ContextVar("toolservices_mcp_connection", default=None)
_NAMESPACE: ContextVar[str | None] = ContextVar("toolservices_mcp_namespace", default=None)
#: Where the HTTP front puts the namespace a request's bearer token proved (ASGI scope key).
NAMESPACE_SCOPE_KEY = "toolservices.namespace"


def current_connection() -> str | None:
    """Which MCP connection the running tool call came on.

    Over HTTP the MCP session id (``Mcp-Session-Id``), on stdio ``"stdio"``
    (one process, one client), ``None`` for a request without a session
    (stateless HTTP) or outside a call. Tools use it to keep per-client state
    apart.
    """
    return _CONNECTION.get()


def current_namespace() -> str | None:
    """The namespace the running tool call's bearer token proved (HTTP with ``tokens``).

    ``None`` without tokens, on stdio, or outside a call. Calls presenting
    the same token (and sub-namespace) get the same namespace whatever their
    MCP connection; the value is derived from a digest, never the token.
    """
    return _NAMESPACE.get()


class _Calls:
    """The ``tools/call`` requests being served, so that a shutdown can drain them."""

    def __init__(self) -> None:
        self.draining = False
        self._scopes: set[anyio.CancelScope] = set()
        self._settled: anyio.Event | None = None

    def open(self) -> anyio.CancelScope:
        scope = anyio.CancelScope()
        self._scopes.add(scope)
        return scope

    def close(self, scope: anyio.CancelScope) -> None:
        self._scopes.discard(scope)
        if not self._scopes and self._settled is not None:
            self._settled.set()

    def cancel_all(self) -> None:
        for scope in list(self._scopes):
            scope.cancel()

    async def settled(self) -> None:
        """Return once no call is in flight."""
        if self._scopes:
            if self._settled is None or self._settled.is_set():
                self._settled = anyio.Event()
            await self._settled.wait()

    async def drain(self, grace: float, hurry: anyio.Event | None = None) -> None:
        """Refuse new calls, let running ones finish within ``grace`` (or until
        ``hurry`` is set), then cancel the rest and wait (bounded) for their answers."""
        self.draining = True
        with anyio.move_on_after(grace):
            async with anyio.create_task_group() as tg:

                async def stop_early() -> None:
                    if hurry is not None:
                        await hurry.wait()
                        tg.cancel_scope.cancel()

                tg.start_soon(stop_early)
                await self.settled()
                tg.cancel_scope.cancel()
        self.cancel_all()
        with anyio.move_on_after(CANCEL_SETTLE_TIMEOUT):
            await self.settled()


#: How long cancelled calls may take to return their answers (they only unwind).
CANCEL_SETTLE_TIMEOUT = 5.0


async def wait_for_signals(
    signals: tuple[signal.Signals, ...], first: anyio.Event, second: anyio.Event
) -> None:
    """Set ``first`` on the first of ``signals``, ``second`` on the next (hurry up)."""
    if not signals:
        await anyio.sleep_forever()
    with anyio.open_signal_receiver(*signals) as received:
        async for _ in received:
            if first.is_set():
                second.set()
            first.set()
