"""The bridge's own event loop thread, reachable from sync code and from other loops.

Every MCP session of a toolset lives on this one loop, started with anyio's
blocking portal (which also owns the sessions' task group). Calls hop onto
it with ``run_coroutine_threadsafe``; async callers on another loop await
that future, and cancelling the caller cancels the call on the bridge loop.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
from collections.abc import Callable, Coroutine
from contextlib import AbstractContextManager
from typing import Any, TypeVar

import anyio
import anyio.to_thread
from anyio.abc import TaskGroup, TaskStatus
from anyio.from_thread import BlockingPortal, start_blocking_portal

from toolservices._portal import wait_on_loop
from toolservices.mcp._connection import ServerConnection

__all__ = ["Bridge"]

logger = logging.getLogger(__name__)

T = TypeVar("T")

#: How long close() waits for the servers to shut down. The SDK bounds each
#: stdio shutdown (stdin close, 2 s grace, SIGTERM, 2 s, SIGKILL), so this is
#: only reached if something is badly wrong; the loop is then cancelled.
CLOSE_TIMEOUT = 20.0


class Bridge:
    """One background event loop and the task group that owns the sessions."""

    def __init__(self) -> None:
        self._cm: AbstractContextManager[BlockingPortal] = start_blocking_portal(
            "asyncio", name="toolservices-mcp"
        )
        self.portal = self._cm.__enter__()
        self.connections: list[ServerConnection] = []
        self._closed = False
        self._lock = threading.Lock()
        try:
            self.thread_id: int = self.portal.call(threading.get_ident)
            self._loop = self.portal.call(asyncio.get_running_loop)
            self._supervisor, self.task_group = self.portal.start_task(self._supervise)
        except BaseException:
            self._cm.__exit__(None, None, None)
            raise

    async def _supervise(self, *, task_status: TaskStatus[TaskGroup]) -> None:
        self._stop = anyio.Event()
        async with anyio.create_task_group() as tg:
            task_status.started(tg)
            await self._stop.wait()
            for connection in self.connections:
                connection.request_close()

    def _request_stop(self) -> None:
        self._stop.set()

    def run(self, fn: Callable[..., Coroutine[Any, Any, T]], *args: Any) -> T:
        """Run ``fn(*args)`` on the bridge loop and wait for it (sync callers)."""
        if threading.get_ident() == self.thread_id:
            raise RuntimeError("blocking call from the MCP bridge's own loop; await it instead")
        # A direct hop: the portal's extra thread wake-ups cost more than the call.
        return wait_on_loop(self._loop, fn, *args)

    async def arun(self, fn: Callable[..., Coroutine[Any, Any, T]], *args: Any) -> T:
        """Await ``fn(*args)`` on the bridge loop from any loop."""
        if threading.get_ident() == self.thread_id:
            return await fn(*args)
        future = asyncio.run_coroutine_threadsafe(fn(*args), self._loop)
        if _on_asyncio():
            # Cancelling the awaiting task cancels the future, hence the task.
            return await asyncio.wrap_future(future)
        try:
            return await anyio.to_thread.run_sync(future.result, abandon_on_cancel=True)
        except anyio.get_cancelled_exc_class():
            future.cancel()
            raise

    def close(self) -> None:
        """Shut every server down, then stop the loop thread. Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        if threading.get_ident() == self.thread_id:
            # Reached from the loop itself (a finalizer run by garbage collection
            # there): waiting would deadlock, so only ask the servers to stop.
            self._request_stop()
            return
        try:
            self.portal.call(self._request_stop)
            self._supervisor.result(timeout=CLOSE_TIMEOUT)
        except concurrent.futures.TimeoutError:
            logger.error("MCP servers did not shut down in %.0fs; cancelling", CLOSE_TIMEOUT)
            self.portal.call(self.portal.stop, True)
        finally:
            self._cm.__exit__(None, None, None)


def _on_asyncio() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True
