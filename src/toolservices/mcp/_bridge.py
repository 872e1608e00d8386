"""The MCP sessions' home on the library's one background loop.

Every MCP session of a toolset lives on the shared loop of
:mod:`toolservices._portal` (the loop the dispatcher's sync entry points use),
inside a task group that one supervisor task owns: there is no second loop
thread. Calls hop onto that loop with ``run_coroutine_threadsafe``; a caller
already on it awaits the call directly, async callers on another loop await
the future, and cancelling the caller cancels the call on the shared loop.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

import anyio
import anyio.to_thread
from anyio.abc import TaskGroup

from toolservices._portal import get_loop, on_loop_thread, wait_on_loop
from toolservices.mcp._connection import ServerConnection

__all__ = ["Bridge"]

logger = logging.getLogger(__name__)

T = TypeVar("T")

#: How long close() waits for the servers to shut down. The SDK bounds each
#: stdio shutdown (stdin close, 2 s grace, SIGTERM, 2 s, SIGKILL), so this is
#: only reached if something is badly wrong; the supervisor is then cancelled.
CLOSE_TIMEOUT = 20.0
#: How long the supervisor may take to open its task group (it only starts a task).
START_TIMEOUT = 30.0


class Bridge:
    """A supervisor task on the shared loop and the task group that owns the sessions."""

    def __init__(self) -> None:
        if on_loop_thread():
            raise RuntimeError(
                "toolservices: MCPToolset.connect() was called from inside the library's event "
                "loop; use 'await toolset.aconnect()' or 'async with toolset'"
            )
        self._loop = get_loop()
        self.connections: list[ServerConnection] = []
        self._closed = False
        self._lock = threading.Lock()
        self._stop: anyio.Event | None = None
        started: concurrent.futures.Future[TaskGroup] = concurrent.futures.Future()
        self._supervisor = asyncio.run_coroutine_threadsafe(self._supervise(started), self._loop)
        pending: list[concurrent.futures.Future[Any]] = [started, self._supervisor]
        concurrent.futures.wait(
            pending,
            timeout=START_TIMEOUT,
            return_when=concurrent.futures.FIRST_COMPLETED,
        )
        if not started.done():
            self._supervisor.cancel()
            if self._supervisor.done():
                self._supervisor.result()  # raises what stopped it
            raise RuntimeError("toolservices: the MCP supervisor task did not start")
        self.task_group: TaskGroup = started.result()

    async def _supervise(self, started: concurrent.futures.Future[TaskGroup]) -> None:
        self._stop = anyio.Event()
        async with anyio.create_task_group() as tg:
            started.set_result(tg)
            await self._stop.wait()
            for connection in self.connections:
                connection.request_close()

    def _request_stop(self) -> None:
        if self._stop is not None:
            self._stop.set()

    def run(self, fn: Callable[..., Coroutine[Any, Any, T]], *args: Any) -> T:
        """Run ``fn(*args)`` on the shared loop and wait for it (sync callers)."""
        if on_loop_thread():
            raise RuntimeError(
                "toolservices: a blocking MCPToolset call was made from inside the library's "
                "event loop; await the async variant instead (for example 'await ts.acall(...)')"
            )
        return wait_on_loop(self._loop, fn, *args)

    async def arun(self, fn: Callable[..., Coroutine[Any, Any, T]], *args: Any) -> T:
        """Await ``fn(*args)`` on the shared loop from any loop."""
        if on_loop_thread():
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
        """Shut every server down and end the supervisor. Idempotent.

        The shared loop itself keeps running (other parts of the library use it).
        """
        with self._lock:
            if self._closed:
                return
            self._closed = True
        if on_loop_thread():
            # Reached from the loop itself (a finalizer run by garbage collection
            # there): waiting would deadlock, so only ask the servers to stop.
            self._request_stop()
            return
        if self._supervisor.done():
            return  # the shared loop was shut down first (interpreter exit): it cancelled us
        try:
            self._loop.call_soon_threadsafe(self._request_stop)
        except RuntimeError:  # the loop closed meanwhile
            return
        try:
            self._supervisor.result(timeout=CLOSE_TIMEOUT)
        except concurrent.futures.TimeoutError:
            logger.error("MCP servers did not shut down in %.0fs; cancelling", CLOSE_TIMEOUT)
            self._supervisor.cancel()
        except concurrent.futures.CancelledError:
            pass  # the shared loop is shutting down and cancelled the sessions itself


def _on_asyncio() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True
