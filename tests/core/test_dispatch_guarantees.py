"""Dispatcher guarantees of issues 10 and 12: bounded abandoned threads, real
cancellation kept, library bugs logged and answered, exceptions kept on results."""

from __future__ import annotations

import asyncio
import logging
import threading

import anyio
import pytest

from toolservices import Dispatcher, ParseFailure, ParseResult, Tool, ToolCall, ToolRegistry, tool
from toolservices.dispatch import CallResult, StepMetrics
from toolservices.errors import ToolBusyError, ToolTimeoutError


class Gate:
    """Counts the calls inside a blocking tool and lets them all out at once."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.changed = threading.Condition()
        self.running = 0
        self.peak = 0
        self.entered = 0

    def hold(self) -> str:
        with self.changed:
            self.running += 1
            self.entered += 1
            self.peak = max(self.peak, self.running)
            self.changed.notify_all()
        try:
            self.release.wait(120)
        finally:
            with self.changed:
                self.running -= 1
                self.changed.notify_all()
        return "late"

    def tool(self, name: str, *, timeout: float | None = 0.05) -> Tool:
        """A sync tool ``name`` that holds its caller's thread in this gate."""

        def hold() -> str:
            """Blocks until the test releases it."""
            return self.hold()

        return tool(name=name, timeout=timeout)(hold)

    def __enter__(self) -> Gate:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release.set()  # whatever the test did, no thread stays blocked


def test_timed_out_sync_calls_hold_at_most_the_cap_of_threads(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """200 timeouts of a hung tool used to leave 200 threads behind."""

    @tool
    def quick() -> str:
        """Answers at once."""
        return "ok"

    with Gate() as gate:
        dispatcher = Dispatcher(ToolRegistry([gate.tool("hang"), quick]), max_abandoned_threads=3)
        with caplog.at_level(logging.WARNING, logger="toolservices.dispatch"):
            results = [dispatcher.run([[ToolCall("hang", {})]])[0].results[0] for _ in range(40)]
        kinds = [r.error_kind for r in results]
        assert kinds == ["timeout"] * 3 + ["infrastructure"] * 37
        assert gate.entered == 3 and gate.peak == 3
        assert dispatcher.abandoned_calls() == {"hang": 3}
        refused = results[-1]
        assert isinstance(refused.exception, ToolBusyError) and refused.exception.retryable
        assert refused.error is not None
        assert "3 earlier calls of it timed out and are still running" in refused.error
        assert isinstance(results[0].exception, ToolTimeoutError)
        warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
        assert len(warnings) == 1 and "'hang'" in warnings[0].getMessage()
        # other tools are not affected
        (outcome,) = dispatcher.run([[ToolCall("quick", {})]])
        assert outcome.results[0].ok
    assert dispatcher.wait_abandoned(timeout=60)
    assert dispatcher.abandoned_calls() == {}
    # the tool is accepted again once its threads ended
    result = dispatcher.run([[ToolCall("hang", {})]])[0].results[0]
    assert result.ok and result.value == "late"


async def test_cancelling_the_caller_propagates_and_counts_the_thread() -> None:
    """A real cancellation is not turned into a failed call, and the sync tool's
    thread it leaves behind counts towards the cap."""
    waiting = anyio.Event()
    waits = waiting_tool(waiting)

    with Gate() as gate:
        dispatcher = Dispatcher(
            ToolRegistry([gate.tool("hang", timeout=None), waits]), timeout=None
        )
        for name in ("hang", "waits"):
            returned = False
            with anyio.CancelScope() as scope:

                async def cancel_when_started(name: str = name) -> None:
                    if name == "hang":
                        await anyio.to_thread.run_sync(_wait_entered, gate)
                    else:
                        await waiting.wait()
                    scope.cancel()

                async with anyio.create_task_group() as tg:
                    tg.start_soon(cancel_when_started)
                    await dispatcher.arun([[ToolCall(name, {})]])
                    returned = True
            assert scope.cancelled_caught and not returned, name
        assert dispatcher.abandoned_calls() == {"hang": 1}
    assert await anyio.to_thread.run_sync(dispatcher.wait_abandoned, 60)


def waiting_tool(started: anyio.Event) -> Tool:
    """An async tool ``waits`` that sets ``started``, then waits until cancelled or closed."""

    @tool
    async def waits() -> str:
        """Waits on the loop until cancelled."""
        started.set()
        await anyio.sleep(3600)
        return "never"

    return waits


def _wait_entered(gate: Gate) -> None:
    with gate.changed:
        assert gate.changed.wait_for(lambda: gate.entered > 0, 60)


async def test_closing_a_suspended_call_is_not_swallowed() -> None:
    """``coroutine.close()`` throws GeneratorExit into the call; it must leave
    (a coroutine that ignores GeneratorExit makes close() raise RuntimeError)."""
    started = anyio.Event()
    coro = Dispatcher(ToolRegistry([waiting_tool(started)])).acall(ToolCall("waits", {}))
    task = asyncio.ensure_future(coro)
    await started.wait()
    coro.close()  # raises RuntimeError if the GeneratorExit was swallowed
    task.cancel()
    with pytest.raises(RuntimeError, match="cannot reuse already awaited coroutine"):
        await task


@tool
def fails() -> None:
    """Raises a plain exception."""
    raise KeyError("missing key")


@tool
def plain(x: int) -> int:
    """Returns x."""
    return x


REGISTRY = ToolRegistry([fails, plain])


def test_a_tool_exception_reads_type_and_message_and_is_kept() -> None:
    (outcome,) = Dispatcher(REGISTRY).run([[ToolCall("fails", {})]])
    (result,) = outcome.results
    assert result.error == "KeyError: 'missing key'"
    assert isinstance(result.exception, KeyError)
    # the exception is for debugging: not compared, not in repr, not serialised
    twin = CallResult(**{**result.to_dict(), "exception": None})
    assert twin == result
    assert "exception=" not in repr(result)
    assert "exception" not in result.to_dict()


def test_a_library_bug_is_logged_with_its_traceback_and_answered(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Fault injection: lookup of the tool (our code) breaks."""

    def broken_get(self: ToolRegistry, name: str) -> None:
        raise AttributeError("registry bug")

    monkeypatch.setattr(ToolRegistry, "get", broken_get)
    with caplog.at_level(logging.ERROR, logger="toolservices.dispatch"):
        (outcome,) = Dispatcher(REGISTRY).run([[ToolCall("plain", {"x": 1})]])
    (result,) = outcome.results
    assert result.error_kind == "internal" and isinstance(result.exception, AttributeError)
    assert result.error is not None and "internal error in toolservices" in result.error
    assert "AttributeError: registry bug" in result.error
    (record,) = caplog.records
    assert record.exc_info is not None and record.exc_info[1] is result.exception


def test_a_bug_while_dispatching_an_item_still_answers_every_call(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Fault injection: building the item's metrics (our code) breaks after the calls ran."""

    def broken(cls: type[StepMetrics], results: list[CallResult]) -> StepMetrics:
        if results and results[0].error_kind != "internal":
            raise ZeroDivisionError("metrics bug")
        return StepMetrics(calls=len(results), failed_calls=len(results))

    monkeypatch.setattr(StepMetrics, "from_results", classmethod(broken))
    parse = ParseResult(
        calls=[ToolCall("plain", {"x": 1}), ToolCall("plain", {"x": 2})],
        errors=[ParseFailure("bad call")],
    )
    with caplog.at_level(logging.ERROR, logger="toolservices.dispatch"):
        good, bad = Dispatcher(REGISTRY).run([[], parse])
    assert good.results == []
    kinds = [r.error_kind for r in bad.results]
    assert kinds == ["internal", "internal", "parse_error"]
    assert all(r.error and "metrics bug" in r.error for r in bad.results[:2])
    assert len({r.call_id for r in bad.results}) == 3
    assert any(r.exc_info for r in caplog.records)


def test_call_ids_are_derived_once_and_match_the_parsers() -> None:
    """A call without an id gets the id a parser would have given it."""
    from toolservices.parsing import make_call_id

    calls = [ToolCall("plain", {"x": 1}, raw="<raw>"), ToolCall("plain", {"x": 1})]
    (outcome,) = Dispatcher(REGISTRY).run([calls])
    assert outcome.results[0].call_id == make_call_id(0, "plain", {"x": 1}, raw="<raw>")
    assert outcome.results[1].call_id == make_call_id(1, "plain", {"x": 1})


def test_any_mapping_renders_as_json_and_a_cycle_still_renders() -> None:
    from types import MappingProxyType

    cyclic: dict[str, object] = {"a": 1}
    cyclic["self"] = cyclic

    @tool
    def proxy() -> object:
        """Returns a read-only mapping."""
        return MappingProxyType({"b": 2})

    @tool
    def cycle() -> object:
        """Returns a dict that contains itself."""
        return cyclic

    (outcome,) = Dispatcher(ToolRegistry([proxy, cycle])).run(
        [[ToolCall("proxy", {}), ToolCall("cycle", {})]]
    )
    assert outcome.results[0].content == '{\n  "b": 2\n}'
    assert outcome.results[1].ok and outcome.results[1].content == "{'a': 1, 'self': {...}}"


def test_calls_already_running_when_the_cap_is_reached_may_still_add_to_it(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The documented bound: cap plus the calls of the tool running at once."""
    with Gate() as gate:
        dispatcher = Dispatcher(ToolRegistry([gate.tool("hang")]), max_abandoned_threads=2)
        with caplog.at_level(logging.WARNING, logger="toolservices.dispatch"):
            batch = dispatcher.run([[ToolCall("hang", {})] for _ in range(5)])
            assert [o.results[0].error_kind for o in batch] == ["timeout"] * 5
            assert dispatcher.abandoned_calls() == {"hang": 5}
            (after,) = dispatcher.run([[ToolCall("hang", {})]])
        assert after.results[0].error_kind == "infrastructure"
        assert gate.entered == 5
        assert len([r for r in caplog.records if r.levelno == logging.WARNING]) == 1
    assert dispatcher.wait_abandoned(timeout=60)


def test_a_call_that_times_out_before_its_thread_starts_is_not_counted() -> None:
    """With every slot taken, a call can time out while waiting for one: it holds
    no thread, so it must not count towards the cap (it did, for ever)."""
    with Gate() as gate:
        # the holder keeps the only slot until it times out; the waiter never gets it in time
        registry = ToolRegistry([gate.tool("holder", timeout=1.0), gate.tool("waiter")])
        dispatcher = Dispatcher(registry, max_concurrency=1)
        first, second = dispatcher.run([[ToolCall("holder", {})], [ToolCall("waiter", {})]])
        assert first.results[0].timed_out and second.results[0].timed_out
        assert dispatcher.abandoned_calls() == {"holder": 1}
    assert dispatcher.wait_abandoned(timeout=60)
    assert gate.entered == 1, "the call that timed out while waiting must never run"
