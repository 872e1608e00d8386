"""Dispatcher: order within an item, concurrency across items, one result per call."""

from __future__ import annotations

import threading
import time

import anyio
import pytest

from toolservices import (
    Dispatcher,
    ParseFailure,
    ParseResult,
    ToolCall,
    ToolRegistry,
    UserError,
    render_tool_results,
    to_openai_messages,
    tool,
)

events: list[tuple[int, str]] = []
lock = threading.Lock()


@tool
def record(item: int, label: str) -> str:
    """Record a call in order."""
    with lock:
        events.append((item, label))
    time.sleep(0.01)
    return label


@tool
async def asleep(seconds: float) -> float:
    """Sleep asynchronously."""
    await anyio.sleep(seconds)
    return seconds


@tool
def fail(message: str = "Test error") -> None:
    """Always raises."""
    raise ValueError(message)


@tool
def stateful(x: int, _state: dict | None = None) -> dict | None:
    return _state


@tool
def stateless(x: int) -> int:
    return x


REGISTRY = ToolRegistry([record, asleep, fail, stateful, stateless])


def test_calls_of_one_item_keep_their_order() -> None:
    events.clear()
    items = [
        [ToolCall("record", {"item": i, "label": f"c{k}"}) for k in range(4)] for i in range(6)
    ]
    outcomes = Dispatcher(REGISTRY).run(items)
    for i in range(6):
        assert [label for item, label in events if item == i] == ["c0", "c1", "c2", "c3"]
        assert [r.value for r in outcomes[i].results] == ["c0", "c1", "c2", "c3"]
        assert [r.index for r in outcomes[i].results] == [0, 1, 2, 3]


class Rendezvous:
    """Counts the calls running at once; ``meet`` returns only when ``n`` are in."""

    def __init__(self, n: int) -> None:
        self.barrier = threading.Barrier(n, timeout=10)
        self.event = anyio.Event() if n else None
        self.n = n
        self.active = 0
        self.peak = 0
        self.lock = threading.Lock()

    def enter(self) -> None:
        with self.lock:
            self.active += 1
            self.peak = max(self.peak, self.active)

    def leave(self) -> None:
        with self.lock:
            self.active -= 1


RENDEZVOUS = Rendezvous(0)


@tool
def meet_sync() -> int:
    """Wait in a thread until every expected call is running."""
    RENDEZVOUS.enter()
    try:
        return RENDEZVOUS.barrier.wait()
    finally:
        RENDEZVOUS.leave()


@tool
async def meet_async() -> int:
    """Wait on the loop until every expected call is running."""
    RENDEZVOUS.enter()
    try:
        if RENDEZVOUS.active == RENDEZVOUS.n:
            RENDEZVOUS.event.set()
        with anyio.fail_after(10):
            await RENDEZVOUS.event.wait()
        return RENDEZVOUS.active
    finally:
        RENDEZVOUS.leave()


@tool
def count_active(seconds: float) -> int:
    """Block briefly while counted as running."""
    RENDEZVOUS.enter()
    try:
        time.sleep(seconds)
        return RENDEZVOUS.peak
    finally:
        RENDEZVOUS.leave()


REGISTRY.register(meet_sync)
REGISTRY.register(meet_async)
REGISTRY.register(count_active)


@pytest.mark.parametrize("tool_name", ["meet_sync", "meet_async"])
async def test_items_run_concurrently(tool_name: str) -> None:
    # Every call waits until all eight run at once (10 s bound), so the test
    # passes only if the items really overlap, however loaded the machine is.
    global RENDEZVOUS
    RENDEZVOUS = Rendezvous(8)
    items = [[ToolCall(tool_name, {})] for _ in range(8)]
    outcomes = await Dispatcher(REGISTRY, timeout=30).arun(items)
    assert all(o.results[0].ok for o in outcomes), [o.results[0].error for o in outcomes]
    assert RENDEZVOUS.peak == 8


def test_max_concurrency_bounds_parallel_calls() -> None:
    global RENDEZVOUS
    RENDEZVOUS = Rendezvous(0)
    items = [[ToolCall("count_active", {"seconds": 0.05})] for _ in range(4)]
    outcomes = Dispatcher(REGISTRY, max_concurrency=1).run(items)
    assert all(o.results[0].ok for o in outcomes)
    assert RENDEZVOUS.peak == 1


def test_timeout_is_isolated_to_its_call() -> None:
    release, cancelled = threading.Event(), threading.Event()
    finished: list[str] = []

    @tool
    def stuck_sync() -> str:
        """Blocks until the test lets it go (60 s at most)."""
        release.wait(60)
        finished.append("sync")
        return "late"

    @tool
    async def stuck_async() -> str:
        """Sleeps until cancelled (60 s at most)."""
        try:
            await anyio.sleep(60)
        except anyio.get_cancelled_exc_class():
            cancelled.set()
            raise
        finished.append("async")
        return "late"

    items = [
        [ToolCall("stuck_sync", {}), ToolCall("stateless", {"x": 1})],
        [ToolCall("stuck_async", {})],
        [ToolCall("stateless", {"x": 2})],
    ]
    registry = ToolRegistry([stuck_sync, stuck_async, stateless])
    try:
        outcomes = Dispatcher(registry, timeout=0.5).run(items)
        # The stuck calls are abandoned, not waited for: the outcomes came back while
        # the blocking call was still blocked, and the async one was cancelled.
        assert finished == []
        assert cancelled.is_set()
    finally:
        release.set()
    first, second, third = outcomes
    assert first.results[0].timed_out and "timed out after 0.5 s" in first.results[0].error
    assert first.results[1].ok and first.results[1].value == 1
    assert second.results[0].timed_out
    assert third.results[0].ok
    assert first.metrics.timeouts == 1 and first.metrics.failed_calls == 1


def test_identical_calls_without_ids_get_distinct_ids() -> None:
    calls = [ToolCall("stateless", {"x": 1}) for _ in range(3)]
    (outcome,) = Dispatcher(REGISTRY, stop_on_error=True).run([calls])
    assert len({r.call_id for r in outcome.results}) == 3
    assert [r.index for r in outcome.results] == [0, 1, 2]


def test_every_call_and_parse_error_gets_one_result() -> None:
    parse = ParseResult(
        text="",
        calls=[
            ToolCall("fail", {}),
            ToolCall("missing", {}),
            ToolCall("stateless", {"x": "nope"}),
            ToolCall("stateless", {"x": 3}, tag="T"),
        ],
        errors=[ParseFailure("Invalid JSON in <tool_call> block", kind="invalid_json")],
    )
    (outcome,) = Dispatcher(REGISTRY).run([parse])
    kinds = [r.error_kind for r in outcome.results]
    assert kinds == ["tool_failed", "unknown_tool", "invalid_arguments", None, "parse_error"]
    assert outcome.results[0].error == "ValueError: Test error"
    assert "Unknown tool: missing" in outcome.results[1].error
    assert outcome.metrics.calls == 4
    assert outcome.metrics.failed_calls == 3
    assert outcome.metrics.parse_errors == 1
    assert len({r.call_id for r in outcome.results}) == 5


def test_stop_on_error_skips_the_rest_but_reports_it() -> None:
    calls = [ToolCall("stateless", {"x": 1}), ToolCall("fail", {}), ToolCall("stateless", {"x": 2})]
    (outcome,) = Dispatcher(REGISTRY, stop_on_error=True).run([calls])
    assert [r.error_kind for r in outcome.results] == [None, "tool_failed", "skipped"]
    assert outcome.stopped_early
    (outcome,) = Dispatcher(REGISTRY).run([calls])
    assert [r.ok for r in outcome.results] == [True, False, True]


def test_state_goes_only_to_tools_that_accept_it() -> None:
    calls = [ToolCall("stateless", {"x": 1}), ToolCall("stateful", {"x": 1})]
    (outcome,) = Dispatcher(REGISTRY).run([calls], states=[{"batch_index": 5, "turn": 2}])
    assert outcome.results[0].ok
    assert outcome.results[1].value == {"batch_index": 5, "turn": 2, "call_index": 1}
    (outcome,) = Dispatcher(REGISTRY, pass_state=False).run([calls], states=[{"turn": 1}])
    assert outcome.results[1].value is None


def test_rendering_matches_the_contract() -> None:
    calls = [
        ToolCall("stateful", {"x": 1}),
        ToolCall("stateless", {"x": 2}, tag="A"),
        ToolCall("fail", {}),
    ]
    (outcome,) = Dispatcher(REGISTRY).run([calls], states=[{"k": "v"}])
    assert render_tool_results(outcome.results) == (
        "<tool_results>\n"
        "Tool stateful (call 1) succeeded:\n"
        '  Result: {\n  "k": "v",\n  "call_index": 0\n}\n'
        "Tool stateless (call 2) [tag: A] succeeded:\n"
        "  Result: 2\n"
        "Tool fail (call 3) failed:\n"
        "  Error: Test error\n"
        "</tool_results>"
    )
    messages = to_openai_messages(outcome.results)
    assert [m["role"] for m in messages] == ["tool"] * 3
    assert messages[2]["content"] == "Error: ValueError: Test error"
    assert messages[1]["tool_call_id"] == outcome.results[1].call_id


async def test_async_entry_point_and_config_errors() -> None:
    outcomes = await Dispatcher(REGISTRY).arun([[ToolCall("asleep", {"seconds": 0})]])
    assert outcomes[0].results[0].value == 0
    with pytest.raises(UserError, match="max_concurrency"):
        Dispatcher(REGISTRY, max_concurrency=0)
    with pytest.raises(UserError, match="timeout"):
        Dispatcher(REGISTRY, timeout=0)
    with pytest.raises(UserError, match="states"):
        await Dispatcher(REGISTRY).arun([[]], states=[{}, {}])
