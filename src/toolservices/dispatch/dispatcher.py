"""Run parsed tool calls for a batch: items concurrently, calls in order.

Every parsed call and every parse error yields exactly one
:class:`CallResult`; nothing a tool or a model does raises out of
:meth:`Dispatcher.arun`. That includes a tool that calls ``sys.exit()``,
raises ``KeyboardInterrupt`` or another ``BaseException``, raises an exception
whose ``__str__`` fails, or returns a value that cannot be shown as text: each
is a failed call, and the shared background loop keeps running. A real
cancellation of the caller (a timeout around ``arun``, Ctrl-C in a sync
caller) still propagates.
"""

from __future__ import annotations

import copy
import functools
import logging
import math
import time
from collections.abc import Mapping, Sequence
from typing import Any, Final

import anyio
import anyio.to_thread

from toolservices._portal import run_sync
from toolservices.dispatch._bound import Limits
from toolservices.dispatch._guard import ThreadRun, current_task, is_real_cancellation
from toolservices.dispatch._state import EpisodeState
from toolservices.dispatch.results import CallResult, ItemResult, StepMetrics, value_text
from toolservices.errors import (
    ErrorKind,
    InfrastructureError,
    ToolBusyError,
    ToolError,
    ToolTimeoutError,
    UserError,
    describe_exception,
)
from toolservices.parsing.base import ParseResult, ToolCall, make_call_id
from toolservices.tools import STATE_PARAMETER
from toolservices.tools.registry import ToolRegistry

__all__ = ["DEFAULT_MAX_ABANDONED_THREADS", "DispatchItem", "Dispatcher", "call_id_of"]

logger = logging.getLogger("toolservices.dispatch")

#: What a batch item may be: a parse result, or a plain sequence of calls.
DispatchItem = ParseResult | Sequence[ToolCall]

#: Default cap on the calls of one sync tool still running after timing out.
#: Each holds a thread (Python cannot kill one); past the cap the tool is
#: refused until one of them ends, so a hung tool cannot grow threads forever.
DEFAULT_MAX_ABANDONED_THREADS = 8


class _Unset:
    """A ``with_options`` argument left out (``timeout=None`` means "no limit")."""

    def __repr__(self) -> str:
        return "UNSET"


_UNSET: Final = _Unset()


class Dispatcher:
    """Executes tool calls against a :class:`ToolRegistry`.

    * calls of one item run strictly in order of appearance;
    * different items run concurrently, at most ``max_concurrency`` calls at
      once (async tools natively, sync tools in worker threads); the bound
      belongs to the dispatcher, so it holds over every caller at once:
      concurrent ``arun``/``run``/``acall`` calls, from any thread or event
      loop, and the dispatchers derived from it (:meth:`with_options`);
    * each call has a time limit (the tool's own ``timeout`` or ``timeout``);
      a sync tool that overruns is abandoned in its thread, since Python
      cannot kill a thread, and reported as timed out. While a tool has
      ``max_abandoned_threads`` such calls still running (counted by this
      dispatcher and those derived from it), its new calls are refused
      (``infrastructure``, a :class:`~toolservices.errors.ToolBusyError` the
      model reads as "try again later"), and reaching the cap logs a warning
      (see ``docs/dispatch.md`` for the exact bound);
    * with ``stop_on_error`` the calls after a failed one are not run and are
      reported as ``skipped``;
    * with ``pass_state`` the per-call state goes, as ``_state=``, to the
      tools that accept it, and only to those: a fresh dict per call (the
      tool's own copy), and with an :class:`EpisodeState` (what an episode
      passes) the tool's writes to the episode's keys persist.

    Failures are reported, never raised: a tool's exception becomes
    ``Type: message`` (``tool_failed``; a :class:`ToolError` keeps its own
    message and kind), and a bug in this library becomes an ``internal``
    result and is logged with its traceback on the ``toolservices.dispatch``
    logger. :attr:`CallResult.exception` keeps the exception either way.
    """

    def __init__(
        self,
        registry: ToolRegistry,
        *,
        max_concurrency: int = 64,
        timeout: float | None = 10.0,
        stop_on_error: bool = False,
        pass_state: bool = True,
        max_abandoned_threads: int = DEFAULT_MAX_ABANDONED_THREADS,
    ) -> None:
        if max_concurrency < 1:
            raise UserError(f"max_concurrency must be at least 1, got {max_concurrency}")
        _checked_timeout(timeout)
        if max_abandoned_threads < 1:
            raise UserError(
                f"max_abandoned_threads must be at least 1, got {max_abandoned_threads}"
            )
        self.registry = registry
        self.timeout = timeout
        self.stop_on_error = stop_on_error
        self.pass_state = pass_state
        self._limits = Limits(
            max_concurrency=max_concurrency, max_abandoned_threads=max_abandoned_threads
        )

    @property
    def max_concurrency(self) -> int:
        """Calls running at once over this dispatcher and those derived from it."""
        return self._limits.bound.total

    @property
    def max_abandoned_threads(self) -> int:
        """Timed-out calls per sync tool left running before the tool is refused."""
        return self._limits.max_abandoned_threads

    def with_options(
        self,
        *,
        registry: ToolRegistry | None = None,
        timeout: float | None | _Unset = _UNSET,
        stop_on_error: bool | None = None,
        pass_state: bool | None = None,
    ) -> Dispatcher:
        """A dispatcher with other tools or settings that shares this one's bound.

        Calls of both count towards the same ``max_concurrency`` and the same
        abandoned-thread counts (an episode with its own tools or timeout
        runs on such a derived dispatcher). Arguments left out keep this
        dispatcher's value.
        """
        derived = copy.copy(self)
        if registry is not None:
            derived.registry = registry
        if not isinstance(timeout, _Unset):
            derived.timeout = _checked_timeout(timeout)
        if stop_on_error is not None:
            derived.stop_on_error = stop_on_error
        if pass_state is not None:
            derived.pass_state = pass_state
        return derived

    def shares_bound_with(self, other: Dispatcher) -> bool:
        """Whether ``other`` counts its calls against this dispatcher's bound."""
        return self._limits is other._limits

    # -- public entry points -------------------------------------------------------

    def run(
        self,
        items: Sequence[DispatchItem],
        *,
        states: Sequence[Mapping[str, Any] | None] | None = None,
    ) -> list[ItemResult]:
        """Synchronous :meth:`arun`, through the shared background loop."""
        return run_sync(functools.partial(self.arun, items, states=states))

    async def arun(
        self,
        items: Sequence[DispatchItem],
        *,
        states: Sequence[Mapping[str, Any] | None] | None = None,
    ) -> list[ItemResult]:
        """Run every item's calls; one :class:`ItemResult` per item, in order.

        Every call takes the dispatcher's bound, shared with every other
        concurrent caller of this dispatcher (and of those derived from it).
        """
        if states is not None and len(states) != len(items):
            raise UserError(f"got {len(states)} states for {len(items)} items")
        if len(items) == 1:
            state = states[0] if states is not None else None
            return [await self._guarded_item(items[0], state, 0)]
        outcomes: list[ItemResult | None] = [None] * len(items)

        async def one(i: int) -> None:
            state = states[i] if states is not None else None
            outcomes[i] = await self._guarded_item(items[i], state, i)

        async with anyio.create_task_group() as tg:
            for i in range(len(items)):
                tg.start_soon(one, i)
        return outcomes  # type: ignore[return-value]  # one() filled every entry

    async def arun_item(
        self, item: DispatchItem, *, state: Mapping[str, Any] | None = None
    ) -> ItemResult:
        """``(await arun([item], states=[state]))[0]``, without the batch.

        The per-turn path of an episode: one response's calls, in order.
        """
        return await self._guarded_item(item, state, 0)

    async def acall(
        self, call: ToolCall, *, state: Mapping[str, Any] | None = None, index: int = 0
    ) -> CallResult:
        """Run a single call under the dispatcher's bound; never raises for anything
        the tool or model did.

        ``index`` is the call's position in its response: it numbers the
        result and, for a call without an id, seeds the derived one (so two
        identical calls of one response get different ids).
        """
        return await self._call(call, state, None, index=index)

    async def _call(
        self,
        call: ToolCall,
        state: Mapping[str, Any] | None,
        extra: Mapping[str, Any] | None,
        *,
        index: int,
    ) -> CallResult:
        """:meth:`acall`; ``extra`` goes over ``state`` (merged only for tools taking state)."""
        started = time.perf_counter()
        call_id = call_id_of(call, index)

        def result(**fields: Any) -> CallResult:
            return CallResult(
                tool=call.tool,
                call_id=call_id,
                tag=call.tag,
                index=index,
                duration=time.perf_counter() - started,
                **fields,
            )

        def failed(exc: BaseException, kind: ErrorKind, error: str) -> CallResult:
            return result(ok=False, error=error, error_kind=kind, exception=exc)

        try:
            tool = self.registry.get(call.tool)
            args = tool.validate(call.args)
            given: dict[str, Any] | None = None
            if self.pass_state and tool.accepts_state and state is not None:
                if isinstance(state, EpisodeState):  # writes go back after the call
                    given = state.for_call(extra)
                else:  # the tool's own copy: what it writes stays there
                    given = {**state, **extra} if extra else dict(state)
                args[STATE_PARAMETER] = given
            limit = tool.timeout if tool.timeout is not None else self.timeout
        except ToolError as exc:
            return failed(exc, exc.kind, exc.message)
        except Exception as exc:  # lookup and validation are ours: a bug, not the model's
            return failed(exc, "internal", _internal(call.tool, exc))

        limits = self._limits
        run = None if tool.is_async else ThreadRun(tool, functools.partial(tool, **args), limits)
        if run is not None and not limits.admit(tool):
            busy = ToolBusyError(
                f"Tool '{call.tool}' was not run: {self.max_abandoned_threads} earlier calls of "
                "it timed out and are still running. Try again later or use another tool."
            )
            return failed(busy, "infrastructure", busy.message)
        task = current_task()
        bound = limits.bound
        value: Any = None
        error: BaseException | None = None
        try:
            with anyio.move_on_after(limit if limit is not None else math.inf) as scope:
                # A free token is taken without yielding to the loop; a full bound
                # queues the call behind the ones already waiting, on any loop.
                if not bound.try_acquire():
                    await bound.acquire()
                try:
                    if run is not None:
                        await anyio.to_thread.run_sync(
                            run, abandon_on_cancel=True, limiter=limits.threads
                        )
                        value, error = run.value, run.error
                    else:
                        value = await tool.acall(**args)
                finally:
                    bound.release()
        except BaseException as exc:
            if is_real_cancellation(exc, task):
                if run is not None:  # the caller gave up: the thread runs on, counted
                    run.abandon()
                raise
            error = exc
        if scope.cancelled_caught:
            if run is not None:
                run.abandon()
            timeout = ToolTimeoutError(
                f"Tool '{call.tool}' timed out after {limit:g} s and was abandoned"
            )
            return failed(timeout, "timeout", timeout.message)
        if given is not None and isinstance(state, EpisodeState):
            state.keep(given, extra)
        if error is not None:
            if isinstance(error, ToolError):
                return failed(error, error.kind, error.message)
            if isinstance(error, InfrastructureError):
                return failed(error, "infrastructure", error.message)
            # the tool's own failure, whatever it raised, reported to the model
            return failed(error, "tool_failed", describe_exception(error))
        try:
            text = value_text(value)
        except BaseException as exc:  # a __str__ that fails (even by exiting), a value too deep
            if is_real_cancellation(exc, task):
                raise
            message = (
                f"Tool '{call.tool}' returned a {type(value).__name__} that cannot be shown as "
                f"text: {describe_exception(exc)}"
            )
            return failed(exc, "tool_failed", message)
        return result(ok=True, value=value, text=text)

    def abandoned_calls(self) -> dict[str, int]:
        """Calls per tool still running in threads after timing out (tools with any)."""
        counts = {t.name: self._limits.abandoned(t) for t in self.registry}
        return {name: n for name, n in counts.items() if n}

    def wait_abandoned(self, timeout: float | None = None) -> bool:
        """Block until every abandoned call of this registry's tools has ended.

        For a clean shutdown: those threads cannot be killed, only waited for.
        Returns False if some are still running after ``timeout`` seconds.
        """
        return self._limits.wait_abandoned(self.registry, timeout)

    # -- internals ---------------------------------------------------------------------

    async def _guarded_item(
        self,
        item: DispatchItem,
        state: Mapping[str, Any] | None,
        position: int,
    ) -> ItemResult:
        try:
            return await self._run_item(item, state)
        except Exception as exc:  # a bug of ours: logged, and every call still answered
            logger.error("toolservices: dispatching batch item %d failed", position, exc_info=exc)
            return _failed_item(item, exc)

    async def _run_item(
        self,
        item: DispatchItem,
        state: Mapping[str, Any] | None,
    ) -> ItemResult:
        parse, calls = _split(item)
        results: list[CallResult] = []
        stopped = False
        for index, call in enumerate(calls):
            if stopped:
                results.append(
                    CallResult(
                        tool=call.tool,
                        call_id=call_id_of(call, index),
                        tag=call.tag,
                        index=index,
                        ok=False,
                        error="Not executed: an earlier call in this response failed",
                        error_kind="skipped",
                    )
                )
                continue
            outcome = await self._call(
                call,
                state,
                {"call_index": index} if state is not None else None,
                index=index,
            )
            results.append(outcome)
            stopped = self.stop_on_error and not outcome.ok
        results.extend(_parse_error_results(parse, len(calls)))
        return ItemResult(
            results=results,
            metrics=StepMetrics.from_results(results),
            parse=parse,
            stopped_early=stopped,
        )


def _checked_timeout(timeout: float | None) -> float | None:
    if timeout is not None and not timeout > 0:
        raise UserError(f"timeout must be a positive number of seconds or None, got {timeout}")
    return timeout


def call_id_of(call: ToolCall, index: int) -> str:
    """The id of the call at ``index`` of its response: its own, else the derived one.

    The one place the dispatcher names calls (results, skipped calls, parse
    errors); it derives ids exactly as the parsers do, so a call's id is the
    same whether a parser or the dispatcher filled it in.
    """
    if call.id:
        return call.id
    try:
        return make_call_id(index, call.tool, call.args, raw=call.raw)
    except Exception:  # arguments that cannot even be serialised: position and name only
        return make_call_id(index, str(call.tool), {})


def _split(item: DispatchItem) -> tuple[ParseResult | None, list[ToolCall]]:
    if isinstance(item, ParseResult):
        return item, list(item.calls)
    return None, list(item)


def _parse_error_results(parse: ParseResult | None, first: int) -> list[CallResult]:
    """One failed result per parse error, numbered after the calls."""
    if parse is None:
        return []
    results = []
    for offset, error in enumerate(parse.errors):
        tool = error.tool or ""
        results.append(
            CallResult(
                tool=tool or "<unparsed>",
                call_id=call_id_of(ToolCall(tool, {}), first + offset),
                index=first + offset,
                ok=False,
                error=error.message,
                error_kind="parse_error",
            )
        )
    return results


def _internal(tool: str, exc: BaseException) -> str:
    """Log a bug of this library with its traceback; the text the model reads."""
    logger.error("toolservices: internal error while calling tool %r", tool, exc_info=exc)
    return (
        f"Tool '{tool}' could not be run because of an internal error in toolservices "
        f"({describe_exception(exc)}); this is not your fault"
    )


def _failed_item(item: DispatchItem, exc: Exception) -> ItemResult:
    """Every call of an item whose dispatch failed on a bug of ours, answered."""
    message = (
        "Not executed because of an internal error in toolservices "
        f"({describe_exception(exc)}); this is not your fault"
    )
    try:
        parse, calls = _split(item)
        results = [
            CallResult(
                tool=str(call.tool),
                call_id=call_id_of(call, index),
                tag=call.tag,
                index=index,
                ok=False,
                error=message,
                error_kind="internal",
                exception=exc,
            )
            for index, call in enumerate(calls)
        ]
        results.extend(_parse_error_results(parse, len(calls)))
    except Exception:  # the item itself is unreadable: one result says so
        parse, results = None, []
    if not results:
        results = [
            CallResult(
                tool="<unknown>",
                call_id=make_call_id(0, "", {}),
                ok=False,
                error=message,
                error_kind="internal",
                exception=exc,
            )
        ]
    return ItemResult(results=results, metrics=StepMetrics.from_results(results), parse=parse)
