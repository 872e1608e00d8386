"""Misbehaving tool bodies and a hang detector, shared by the issue-10 tests.

The core tests (tests/core/test_never_wedge.py) send these through the
dispatcher and ToolEnv, the TorchRL ones (tests/torchrl/test_tool_failures.py)
through real ChatEnvs: one list of misbehaviours for both.
"""

from __future__ import annotations

import asyncio
import sys
import threading
from collections.abc import Callable
from typing import Any, TypeVar

import pytest

from toolservices import tool

T = TypeVar("T")


def returns(fn: Callable[[], T], *, within: float = 120.0) -> T:
    """``fn()`` run in a helper thread; fails the test if it has not returned in time.

    The bound is only the hang detector (a working call returns in
    milliseconds): before the issue-10 fix these calls never returned.
    """
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["value"] = fn()
        except BaseException as exc:
            box["error"] = exc

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(within)
    if thread.is_alive():
        pytest.fail(f"the call did not return within {within:g} s: the process is wedged")
    if "error" in box:
        raise box["error"]
    return box["value"]


class Custom(BaseException):
    """A BaseException subclass that is neither an exit nor an interrupt."""


class Unprintable(Exception):
    def __str__(self) -> str:
        raise RuntimeError("no text for you")


class ExitingMessage(Exception):
    def __str__(self) -> str:
        raise SystemExit("from __str__")


class ExitingStr:
    def __str__(self) -> str:
        raise SystemExit("from __str__")


class NoStr:
    def __str__(self) -> str:
        raise ValueError("str() refused")

    def __repr__(self) -> str:
        raise ValueError("repr() refused")


def deep(depth: int = 100_000) -> list[Any]:
    """A list nested ``depth`` levels deep (too deep for any renderer)."""
    value: list[Any] = []
    for _ in range(depth):
        value = [value]
    return value


#: What a tool may raise, by name (plus ``"exit"``: ``sys.exit(3)``).
RAISED: dict[str, Callable[[], BaseException]] = {
    "SystemExit": lambda: SystemExit(3),
    "KeyboardInterrupt": KeyboardInterrupt,
    "Custom": lambda: Custom("custom base"),
    "GeneratorExit": GeneratorExit,
    "CancelledError": asyncio.CancelledError,
    "Unprintable": Unprintable,
    "ExitingMessage": ExitingMessage,
}
#: Values that cannot be shown as text, by name.
UNSHOWABLE: dict[str, Callable[[], Any]] = {"nostr": NoStr, "exiting": ExitingStr, "deep": deep}
RAISE_KINDS = ["exit", *RAISED]
ALL_KINDS = [*RAISE_KINDS, *UNSHOWABLE]


def misbehave(kind: str) -> Any:
    """Raise the named exception, or return the named value that cannot be text."""
    if kind in UNSHOWABLE:
        return UNSHOWABLE[kind]()
    if kind == "exit":
        sys.exit(3)
    raise RAISED[kind]()


def async_kinds(kinds: list[str]) -> list[str]:
    """``kinds`` an async tool can show: before Python 3.11 a task cannot tell a
    tool's own CancelledError from a real cancellation, so that one is real there."""
    if sys.version_info >= (3, 11):
        return kinds
    return [k for k in kinds if k != "CancelledError"]


@tool
def in_thread(kind: str) -> Any:
    """Misbehaves (see :func:`misbehave`) in a worker thread."""
    return misbehave(kind)


@tool
async def on_loop(kind: str) -> Any:
    """Misbehaves (see :func:`misbehave`) on the event loop."""
    return misbehave(kind)
