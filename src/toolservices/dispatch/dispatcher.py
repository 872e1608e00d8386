"""Run parsed tool calls for a batch: items concurrently, calls in order.

Every parsed call and every parse error yields exactly one
:class:`CallResult`; nothing a tool or a model does raises out of
:meth:`Dispatcher.arun`.
"""

from __future__ import annotations

import functools
import math
import time
from collections.abc import Mapping, Sequence
from typing import Any

import anyio
import anyio.to_thread

from toolservices._portal import run_sync
from toolservices.dispatch.results import CallResult, ItemResult, StepMetrics
from toolservices.errors import InfrastructureError, ToolError, UserError
from toolservices.parsing.base import ParseResult, ToolCall, make_call_id
from toolservices.tools._function_schema import STATE_PARAMETER
from toolservices.tools.registry import ToolRegistry

__all__ = ["Dispatcher", "DispatchItem"]

#: What a batch item may be: a parse result, or a plain sequence of calls.
DispatchItem = ParseResult | Sequence[ToolCall]


class Dispatcher:
    """Executes tool calls against a :class:`ToolRegistry`.

    * calls of one item run strictly in order of appearance;
    * different items run concurrently, at most ``max_concurrency`` calls at
      once (async tools natively, sync tools in worker threads);
    * each call has a time limit (the tool's own ``timeout`` or ``timeout``);
      a sync tool that overruns is abandoned in its thread, since Python
      cannot kill a thread, and reported as timed out;
    * with ``stop_on_error`` the calls after a failed one are not run and are
      reported as ``skipped``;
    * with ``pass_state`` the per-call state dict goes, as ``_state=``, to the
      tools that accept it, and only to those.
    """

    def __init__(
        self,
        registry: ToolRegistry,
        *,
        max_concurrency: int = 64,
        timeout: float | None = 10.0,
        stop_on_error: bool = False,
        pass_state: bool = True,
    ) -> None:
        if max_concurrency < 1:
            raise UserError(f"max_concurrency must be at least 1, got {max_concurrency}")
        if timeout is not None and not timeout > 0:
            raise UserError(f"timeout must be a positive number of seconds or None, got {timeout}")
        self.registry = registry
        self.max_concurrency = max_concurrency
        self.timeout = timeout
        self.stop_on_error = stop_on_error
        self.pass_state = pass_state

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
        limiter: anyio.CapacityLimiter | None = None,
    ) -> list[ItemResult]:
        """Run every item's calls; one :class:`ItemResult` per item, in order.

        ``limiter`` is a bound shared with other concurrent ``arun`` calls
        (what episodes stepping independently share); every call takes it.
        """
        if states is not None and len(states) != len(items):
            raise UserError(f"got {len(states)} states for {len(items)} items")
        # Calls of one item are sequential, so a batch no larger than the bound
        # cannot exceed it; the limiter then only sizes the worker threads.
        bounded = limiter is not None or len(items) > self.max_concurrency
        if limiter is None:
            limiter = anyio.CapacityLimiter(self.max_concurrency)
        outcomes: list[ItemResult] = [ItemResult() for _ in items]

        async def one(i: int) -> None:
            state = states[i] if states is not None else None
            outcomes[i] = await self._run_item(items[i], state, limiter, bounded)

        if len(items) == 1:
            await one(0)
        else:
            async with anyio.create_task_group() as tg:
                for i in range(len(items)):
                    tg.start_soon(one, i)
        return outcomes

    async def acall(
        self,
        call: ToolCall,
        *,
        state: Mapping[str, Any] | None = None,
        limiter: anyio.CapacityLimiter | None = None,
        bound_async: bool = True,
        index: int = 0,
    ) -> CallResult:
        """Run a single call; never raises for anything the tool or model did.

        ``limiter`` caps concurrent calls (and sizes the threads of sync
        tools); ``bound_async=False`` lets async tools skip it. ``index`` is
        the call's position in its response: it numbers the result and, for a
        call without an id, seeds the derived one (so two identical calls of
        one response get different ids).
        """
        started = time.perf_counter()

        def result(**fields: Any) -> CallResult:
            return CallResult(
                tool=call.tool,
                call_id=_call_id(call, index),
                tag=call.tag,
                index=index,
                duration=time.perf_counter() - started,
                **fields,
            )

        try:
            tool = self.registry.get(call.tool)
            args = tool.validate(call.args)
            if self.pass_state and tool.accepts_state and state is not None:
                args[STATE_PARAMETER] = dict(state)
            limit = tool.timeout if tool.timeout is not None else self.timeout
            with anyio.move_on_after(limit if limit is not None else math.inf) as scope:
                if tool.is_async:
                    if limiter is None or not bound_async:
                        value = await tool.acall(**args)
                    else:
                        async with limiter:
                            value = await tool.acall(**args)
                else:
                    value = await anyio.to_thread.run_sync(
                        functools.partial(tool, **args), abandon_on_cancel=True, limiter=limiter
                    )
            if scope.cancelled_caught:
                return result(
                    ok=False,
                    error=f"Tool '{call.tool}' timed out after {limit:g} s and was abandoned",
                    error_kind="timeout",
                )
        except ToolError as exc:
            return result(ok=False, error=exc.message, error_kind=exc.kind)
        except InfrastructureError as exc:
            return result(ok=False, error=exc.message, error_kind="infrastructure")
        except Exception as exc:  # the tool's own failure, reported to the model
            return result(ok=False, error=str(exc) or type(exc).__name__, error_kind="tool_failed")
        return result(ok=True, value=value)

    # -- internals ---------------------------------------------------------------------

    async def _run_item(
        self,
        item: DispatchItem,
        state: Mapping[str, Any] | None,
        limiter: anyio.CapacityLimiter,
        bounded: bool,
    ) -> ItemResult:
        parse: ParseResult | None = None
        if isinstance(item, ParseResult):
            parse, calls = item, list(item.calls)
        else:
            calls = list(item)
        results: list[CallResult] = []
        stopped = False
        for index, call in enumerate(calls):
            if stopped:
                results.append(
                    CallResult(
                        tool=call.tool,
                        call_id=_call_id(call, index),
                        tag=call.tag,
                        index=index,
                        ok=False,
                        error="Not executed: an earlier call in this response failed",
                        error_kind="skipped",
                    )
                )
                continue
            call_state = None
            if state is not None:
                call_state = {**state, "call_index": index}
            outcome = await self.acall(
                call, state=call_state, limiter=limiter, bound_async=bounded, index=index
            )
            results.append(outcome)
            stopped = self.stop_on_error and not outcome.ok
        if parse is not None:
            for offset, error in enumerate(parse.errors):
                results.append(
                    CallResult(
                        tool=error.tool or "<unparsed>",
                        call_id=make_call_id(len(calls) + offset, error.tool or "", {}),
                        index=len(calls) + offset,
                        ok=False,
                        error=error.message,
                        error_kind="parse_error",
                    )
                )
        return ItemResult(
            results=results,
            metrics=StepMetrics.from_results(results),
            parse=parse,
            stopped_early=stopped,
        )


def _call_id(call: ToolCall, index: int) -> str:
    return call.id or make_call_id(index, call.tool, call.args)
