"""Episode lifecycle hooks: ``setup`` before the first turn, ``finalize`` after the last.

A hook takes the :class:`~toolservices.Episode` and may be a plain function
or a coroutine function. A plain one runs in a worker thread, so it may use
the services' synchronous API (``shell.run``, ``python.execute``), which
waits on the library's loop: on that loop itself it would deadlock.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, TypeAlias

import anyio.to_thread

from toolservices.errors import UserError

if TYPE_CHECKING:
    from toolservices.env.episode import Episode

__all__ = ["EpisodeHook", "call_hook", "check_hook"]

#: ``setup(episode)`` / ``finalize(episode)``: sync or async; finalize's return is kept.
EpisodeHook: TypeAlias = "Callable[[Episode], Any] | Callable[[Episode], Awaitable[Any]]"


def check_hook(name: str, hook: object) -> None:
    """A :class:`UserError` at construction for a hook that cannot be called."""
    if hook is not None and not callable(hook):
        raise UserError(
            f"{name} must be a function taking the episode (sync or async), "
            f"got {type(hook).__name__}"
        )


def _is_async(hook: Any) -> bool:
    while isinstance(hook, functools.partial):
        hook = hook.func
    return inspect.iscoroutinefunction(hook) or inspect.iscoroutinefunction(
        getattr(hook, "__call__", None)  # noqa: B004 - a callable object's async __call__
    )


async def call_hook(hook: Callable[[Episode], Any], episode: Episode) -> Any:
    """Run ``hook(episode)``: awaited when async, in a worker thread when not."""
    if _is_async(hook):
        return await hook(episode)
    result = await anyio.to_thread.run_sync(hook, episode)
    if inspect.isawaitable(result):  # a plain function that returned a coroutine
        result = await result
    return result
