"""One background event loop that sync callers share.

The library's core is async. Synchronous entry points (TorchRL transforms,
``Dispatcher.run``, the executor's ``execute``) hand their coroutine to this
loop instead of starting an event loop per call. The loop runs in a daemon
thread started on first use and is stopped at interpreter exit.

A plain ``asyncio.run_coroutine_threadsafe`` hop is used rather than an anyio
blocking portal: on this kind of machine a thread wake-up costs ~60 us, and
the portal adds more of them per call. The loop runs one long-lived root task
(``run_until_complete``), which anyio uses to scope its worker threads;
without it anyio would start fresh threads for every submitted call.

The loop thread must outlive anything run on it. A ``SystemExit`` or
``KeyboardInterrupt`` raised inside a task escapes asyncio's task machinery
and would stop the loop (and with it every sync caller, forever): a
coroutine submitted through :func:`wait_on_loop` hands such an exception to
its caller's thread instead, and for any other task :func:`get_loop`'s
thread logs it and keeps the loop running.
"""

from __future__ import annotations

import asyncio
import atexit
import logging
import threading
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

__all__ = [
    "get_loop",
    "on_loop_thread",
    "run_inline",
    "run_sync",
    "shutdown_portal",
    "started_loop",
    "wait_on_loop",
]

T = TypeVar("T")

logger = logging.getLogger("toolservices.portal")

_lock = threading.Lock()
_loop: asyncio.AbstractEventLoop | None = None
_thread: threading.Thread | None = None
_stop: asyncio.Event | None = None


def get_loop() -> asyncio.AbstractEventLoop:
    """The shared loop, started on first use."""
    global _loop, _thread, _stop
    loop = _loop
    if loop is not None:
        return loop
    with _lock:
        if _loop is None:
            new_loop = asyncio.new_event_loop()
            ready = threading.Event()

            async def root() -> None:
                global _stop
                _stop = asyncio.Event()
                ready.set()
                await _stop.wait()
                await _cancel_pending()

            def serve() -> None:
                asyncio.set_event_loop(new_loop)
                main = new_loop.create_task(root())
                while True:
                    try:
                        new_loop.run_until_complete(main)
                        return
                    except (SystemExit, KeyboardInterrupt) as exc:
                        # raised by some task on the loop (asyncio re-raises these out
                        # of run_forever); the task has failed, the loop goes on
                        if main.done():  # the loop's own root task: nothing left to serve
                            return
                        logger.error(
                            "toolservices: %s escaped a task on the shared loop; the loop "
                            "keeps running",
                            type(exc).__name__,
                            exc_info=exc,
                        )

            _thread = threading.Thread(target=serve, name="toolservices-loop", daemon=True)
            _thread.start()
            ready.wait()
            _loop = new_loop
            atexit.register(shutdown_portal)
        return _loop


def started_loop() -> asyncio.AbstractEventLoop | None:
    """The shared loop if it is running (never starts it)."""
    loop = _loop
    return loop if loop is not None and loop.is_running() else None


def on_loop_thread() -> bool:
    """True in the shared loop's own thread (where blocking would stall every caller)."""
    return threading.current_thread() is _thread


def run_sync(fn: Callable[..., Coroutine[Any, Any, T]], *args: Any) -> T:
    """Run ``await fn(*args)`` on the shared loop and return its result.

    Raises :class:`RuntimeError` when called from the loop thread itself,
    which would deadlock; async code must await the coroutine directly.
    """
    loop = get_loop()
    if on_loop_thread():
        raise RuntimeError(
            "toolservices: a synchronous API was called from inside its own event loop; "
            "use the async variant (for example 'await dispatcher.arun(...)')"
        )
    return wait_on_loop(loop, fn, *args)


def run_inline(coro: Coroutine[Any, Any, T]) -> T:
    """Run ``coro`` to its end in the calling thread, without an event loop.

    For an async core whose sync face calls blocking functions where the async
    one awaits (``ShellService``: the executor's ``execute`` for its
    ``aexecute``): such a coroutine never suspends, and a sync call then costs
    no hop to the loop's thread. One that does suspend is a bug: it is closed
    (its ``finally`` blocks run) and :class:`RuntimeError` raised.
    """
    try:
        coro.send(None)
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]
    coro.close()
    raise RuntimeError(
        "toolservices: a coroutine run inline waited for the event loop; its sync face "
        "must call only functions that do not (a bug in toolservices)"
    )


def wait_on_loop(
    loop: asyncio.AbstractEventLoop, fn: Callable[..., Coroutine[Any, Any, T]], *args: Any
) -> T:
    """Run ``await fn(*args)`` on ``loop`` (served by another thread) and wait for it.

    An exception while waiting, such as Ctrl-C, cancels the coroutine instead of
    leaving it running on the loop. Cancelling the future is not enough: the
    interrupt can arrive while the call is being scheduled, before the future is
    ours, so the coroutine registers its task and checks a flag when it starts.
    """
    interrupted: list[bool] = []
    tasks: list[asyncio.Task[Any]] = []

    async def guarded() -> T | _Escaped:
        task = asyncio.current_task()
        if task is not None:
            tasks.append(task)
        if interrupted:
            raise asyncio.CancelledError
        try:
            return await fn(*args)
        except (SystemExit, KeyboardInterrupt) as exc:  # would stop the loop: the caller's
            return _Escaped(exc)

    try:
        outcome = asyncio.run_coroutine_threadsafe(guarded(), loop).result()
    except BaseException:
        interrupted.append(True)
        if not loop.is_closed():  # cancels a task still running; a no-op for a finished one
            loop.call_soon_threadsafe(_cancel_tasks, tasks)
        raise
    if isinstance(outcome, _Escaped):
        raise outcome.exc
    return outcome


class _Escaped:
    """A ``SystemExit`` or ``KeyboardInterrupt`` on its way to the caller's thread."""

    __slots__ = ("exc",)

    def __init__(self, exc: BaseException) -> None:
        self.exc = exc


def _cancel_tasks(tasks: list[asyncio.Task[Any]]) -> None:
    for task in tasks:
        task.cancel()


def shutdown_portal() -> None:
    """Stop the shared loop (called at interpreter exit; safe to call twice).

    Tasks still pending are cancelled and given a chance to clean up.
    """
    global _loop, _thread, _stop
    with _lock:
        loop, thread, stop = _loop, _thread, _stop
        _loop, _thread, _stop = None, None, None
    if loop is None or thread is None or stop is None:
        return
    loop.call_soon_threadsafe(stop.set)
    thread.join(timeout=10)
    if not thread.is_alive():
        loop.close()


async def _cancel_pending() -> None:
    current = asyncio.current_task()
    tasks = [t for t in asyncio.all_tasks() if t is not current]
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
