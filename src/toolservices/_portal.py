"""One background event loop that sync callers share.

The library's core is async. Synchronous entry points (TorchRL transforms,
``Dispatcher.run``, the executor's ``execute``) hand their coroutine to this
loop through an anyio blocking portal instead of starting an event loop per
call. The loop thread starts on first use and stops at interpreter exit.
"""

from __future__ import annotations

import atexit
import threading
from collections.abc import Awaitable, Callable
from contextlib import AbstractContextManager
from typing import Any, TypeVar

from anyio.from_thread import BlockingPortal, start_blocking_portal

__all__ = ["get_portal", "run_sync", "shutdown_portal"]

T = TypeVar("T")

_lock = threading.Lock()
_portal: BlockingPortal | None = None
_portal_cm: AbstractContextManager[BlockingPortal] | None = None
_portal_thread: int | None = None


def get_portal() -> BlockingPortal:
    """The shared portal, started on first use."""
    global _portal, _portal_cm, _portal_thread
    portal = _portal
    if portal is not None:
        return portal
    with _lock:
        if _portal is None:
            cm = start_blocking_portal(backend="asyncio")
            _portal = cm.__enter__()
            _portal_cm = cm
            _portal_thread = _portal.call(threading.get_ident)
            atexit.register(shutdown_portal)
        return _portal


def run_sync(fn: Callable[..., Awaitable[T]], *args: Any) -> T:
    """Run ``await fn(*args)`` on the shared loop and return its result.

    Raises :class:`RuntimeError` when called from the loop thread itself,
    which would deadlock; async code must await the coroutine directly.
    """
    portal = get_portal()
    if threading.get_ident() == _portal_thread:
        raise RuntimeError(
            "toolservices: a synchronous API was called from inside its own event loop; "
            "use the async variant (for example 'await dispatcher.arun(...)')"
        )
    return portal.call(fn, *args)


def shutdown_portal() -> None:
    """Stop the shared loop (called at interpreter exit; safe to call twice)."""
    global _portal, _portal_cm, _portal_thread
    with _lock:
        cm, _portal, _portal_cm, _portal_thread = _portal_cm, None, None, None
    if cm is not None:
        cm.__exit__(None, None, None)
