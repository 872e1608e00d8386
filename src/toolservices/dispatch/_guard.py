"""Keeping a tool's failures inside its call: worker threads and cancellation.

Two things can turn one bad tool into a wedged process. A ``SystemExit`` or
``KeyboardInterrupt`` that reaches the event loop stops the loop thread; so
sync tools run in threads that catch everything (:class:`ThreadRun`), and
async tools' exceptions are sorted by :func:`is_real_cancellation` into the
tool's own failures and a real cancellation of the caller. And a sync tool
that hangs keeps its thread after the dispatcher gave up on it; the count of
such threads per tool is kept by the dispatcher's
:class:`~toolservices.dispatch._bound.Limits` (:meth:`ThreadRun.abandon`).
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable
from typing import Any

import anyio

from toolservices.dispatch._bound import Limits
from toolservices.tools.base import Tool

__all__ = ["ThreadRun", "current_task", "is_real_cancellation"]

logger = logging.getLogger("toolservices.dispatch")


class ThreadRun:
    """One sync tool call in a worker thread, as the thread and the dispatcher share it.

    The thread catches everything the tool raises, ``SystemExit`` and
    ``KeyboardInterrupt`` included: raised into the event loop, those would
    stop the shared loop thread and wedge every later sync call. A call the
    dispatcher abandons at its timeout is counted on the dispatcher's
    :class:`Limits` while its thread runs. One abandoned before its thread
    started (it waited for a free slot, or in the worker's queue) holds no
    thread: it is not counted, and it never starts, since its caller is gone.
    """

    __slots__ = ("abandoned", "error", "fn", "limits", "state", "tool", "value")

    def __init__(self, tool: Tool, fn: Callable[[], Any], limits: Limits) -> None:
        self.tool, self.fn, self.limits = tool, fn, limits
        self.state = "pending"  # then "running", then "done"
        self.abandoned = False
        self.value: Any = None
        self.error: BaseException | None = None

    def __call__(self) -> ThreadRun:
        lock = self.limits.abandoned_changed
        with lock:
            if self.abandoned:  # the caller gave up before the thread got to it
                self.state = "done"
                return self
            self.state = "running"
        try:
            self.value = self.fn()
        except BaseException as exc:  # the tool's: the dispatcher reports it, never raised here
            self.error = exc
        finally:
            with lock:
                self.state = "done"
                if self.abandoned:
                    self.limits.add_abandoned(self.tool, -1)
            if self.abandoned:
                logger.debug("an abandoned call of tool %r has ended", self.tool.name)
        return self

    def abandon(self) -> None:
        """The dispatcher stopped waiting: count the thread on the tool while it runs."""
        limits = self.limits
        with limits.abandoned_changed:
            if self.state == "done" or self.abandoned:
                return
            self.abandoned = True
            if self.state == "pending":
                return
            count = limits.add_abandoned(self.tool, 1)
        cap = limits.max_abandoned_threads
        if count == cap:  # once per crossing (counts move by one, under the lock)
            logger.warning(
                "toolservices: %d calls of tool %r timed out and are still running in their "
                "threads (cap %d); its calls are refused until one of them ends",
                count,
                self.tool.name,
                cap,
            )


# -- cancellation ------------------------------------------------------------------------


def current_task() -> asyncio.Task[Any] | None:
    try:
        return asyncio.current_task()
    except RuntimeError:  # not on an asyncio loop (trio through anyio)
        return None


def is_real_cancellation(exc: BaseException, task: asyncio.Task[Any] | None) -> bool:
    """Whether ``exc`` stops this coroutine for real (so it must propagate).

    A tool can raise ``CancelledError``, ``GeneratorExit`` or
    ``KeyboardInterrupt`` itself; then it is only the tool's failure. A real
    cancellation is a ``CancelledError`` while our task has a pending cancel
    request, a ``GeneratorExit`` thrown in while the coroutine is being
    closed (from outside our task), or a ``KeyboardInterrupt`` in the main
    thread (Ctrl-C can only land there). ``task=None`` (sync code) keeps
    every ``CancelledError`` and ``GeneratorExit`` real, to be safe. Before
    Python 3.11 a task cannot say whether it is being cancelled, so there
    every ``CancelledError`` is real.
    """
    if isinstance(exc, asyncio.CancelledError):
        cancelling = getattr(task, "cancelling", None)  # Python 3.11+
        return cancelling is None or cancelling() > 0
    if isinstance(exc, GeneratorExit):
        return task is None or current_task() is not task
    if isinstance(exc, KeyboardInterrupt):
        return threading.current_thread() is threading.main_thread()
    try:
        cancelled = anyio.get_cancelled_exc_class()
    except RuntimeError:  # no async library runs here: plain sync code (a renderer)
        return False
    return isinstance(exc, cancelled)
