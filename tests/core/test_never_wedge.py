"""Issue 10: nothing a tool does may wedge the process or escape a step.

A tool that exits, interrupts, raises any ``BaseException``, raises an
exception that cannot be printed, or returns a value that cannot be shown as
text gets one failed result; the shared background loop keeps serving every
later sync call, and a batch is never left half-updated.

Each sync call runs under :func:`returns`, which fails the test if the call
does not come back (before the fix it never did) instead of hanging until
the per-test timeout.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest
from tests._misbehaving import (
    RAISE_KINDS,
    ExitingStr,
    NoStr,
    async_kinds,
    deep,
    in_thread,
    on_loop,
    returns,
)

from toolservices import Dispatcher, ToolCall, ToolEnv, ToolRegistry, tool
from toolservices.dispatch import CallResult, render_tool_results, to_openai_messages


@tool
def ok() -> str:
    """Works."""
    return "fine"


REGISTRY = ToolRegistry([in_thread, on_loop, ok])
KINDS = RAISE_KINDS
ASYNC_KINDS = async_kinds(KINDS)


def _still_working() -> None:
    """Every kind of later sync call still answers (the loop thread is alive)."""
    (outcome,) = returns(lambda: Dispatcher(REGISTRY).run([[ToolCall("ok", {})]]))
    assert outcome.results[0].ok and outcome.results[0].value == "fine"


@pytest.mark.parametrize(
    ("name", "kind"),
    [("in_thread", k) for k in KINDS] + [("on_loop", k) for k in ASYNC_KINDS],
)
def test_any_exception_from_a_tool_is_a_failed_call(name: str, kind: str) -> None:
    calls = [ToolCall(name, {"kind": kind}), ToolCall("ok", {})]
    (outcome,) = returns(lambda: Dispatcher(REGISTRY).run([calls]))
    failed, after = outcome.results
    assert not failed.ok and failed.error_kind == "tool_failed"
    expected = "SystemExit" if kind == "exit" else kind
    assert failed.error is not None and failed.error.startswith(expected)
    assert type(failed.exception).__name__ == expected
    assert after.ok, "the call after the failed one must still run"
    _still_working()


def test_an_exception_whose_str_exits_still_reads() -> None:
    (outcome,) = returns(
        lambda: Dispatcher(REGISTRY).run([[ToolCall("on_loop", {"kind": "ExitingMessage"})]])
    )
    assert outcome.results[0].error == "ExitingMessage: <str() of the exception failed: SystemExit>"


def test_an_unprintable_exception_still_reads() -> None:
    (outcome,) = returns(
        lambda: Dispatcher(REGISTRY).run([[ToolCall("in_thread", {"kind": "Unprintable"})]])
    )
    assert outcome.results[0].error == "Unprintable: <str() of the exception failed: RuntimeError>"


@pytest.mark.parametrize("name", ["in_thread", "on_loop"])
@pytest.mark.parametrize(
    ("kind", "cause"),
    [("nostr", "ValueError"), ("deep", "RecursionError"), ("exiting", "SystemExit")],
)
def test_a_value_that_cannot_be_text_is_a_failed_call(name: str, kind: str, cause: str) -> None:
    (outcome,) = returns(lambda: Dispatcher(REGISTRY).run([[ToolCall(name, {"kind": kind})]]))
    (result,) = outcome.results
    assert not result.ok and result.error_kind == "tool_failed"
    assert result.error is not None and "cannot be shown as text" in result.error
    assert cause in result.error
    # every renderer reads it without raising
    assert render_tool_results(outcome.results)
    assert to_openai_messages(outcome.results)[0]["content"].startswith("Error: ")
    _still_working()


class OddStr(str):
    def __str__(self) -> str:
        raise ValueError("a str subclass with a broken __str__")

    __format__ = __str__  # type: ignore[assignment]


def test_a_str_subclass_renders_as_its_characters() -> None:
    from toolservices.dispatch import render_simple

    @tool
    def odd() -> str:
        """Returns a str subclass."""
        return OddStr("plain text")

    (outcome,) = Dispatcher(ToolRegistry([odd])).run([[ToolCall("odd", {})]])
    (result,) = outcome.results
    assert result.ok and result.content == "plain text"
    assert "Result: plain text" in render_tool_results([result])
    assert render_simple(result) == "Tool odd executed successfully:\nplain text"


def test_renderers_survive_a_result_built_by_hand() -> None:
    """A CallResult not made by the dispatcher (no text yet) still renders."""
    from toolservices.dispatch import render_simple

    for value in (NoStr(), ExitingStr(), deep()):
        result = CallResult(tool="t", call_id="c", ok=True, value=value)
        assert "cannot be shown as text" in result.content
        assert "cannot be shown as text" in render_tool_results([result])
        assert "cannot show" in render_simple(result)
    # str() of a container calls repr() of its items, which JSON does not need
    result = CallResult(tool="t", call_id="c", ok=True, value={"k": NoStr()}, text="{}")
    assert render_simple(result).endswith("that str() cannot show: ValueError: repr() refused>")


@pytest.mark.parametrize("result_format", ["openai", "tool_results"])
def test_tool_env_stays_consistent_whatever_the_tools_do(result_format: Any) -> None:
    """Every assistant turn with calls is followed by its tool message(s), every step."""
    cases = [("in_thread", k) for k in KINDS] + [("on_loop", k) for k in ASYNC_KINDS]
    cases += [(n, k) for n in ("in_thread", "on_loop") for k in ("nostr", "deep", "exiting")]
    env = ToolEnv(REGISTRY, parser="hermes", max_turns=2, result_format=result_format)
    env.reset(["go"] * len(cases))
    responses = [
        f'<tool_call>\n{{"name": "{name}", "arguments": {{"kind": "{kind}"}}}}\n</tool_call>'
        for name, kind in cases
    ]
    step = returns(lambda: env.step(responses))
    for i, conversation in enumerate(env.messages):
        assert [m["role"] for m in conversation] == ["user", "assistant", "tool"], cases[i]
        assert step.metrics[i].failed_calls == 1, cases[i]
        assert not step.done[i]
        content = conversation[-1]["content"]
        assert isinstance(content, str) and content, cases[i]
    # and the next step of the same env works
    answer = returns(lambda: env.step(["done"] * len(cases)))
    assert all(answer.done)
    _still_working()


def test_a_coroutine_given_to_the_portal_that_exits_does_not_stop_the_loop() -> None:
    from toolservices._portal import run_sync

    async def leave() -> None:
        raise SystemExit(5)

    with pytest.raises(SystemExit):
        returns(lambda: run_sync(leave))
    _still_working()


def test_a_task_on_the_loop_that_interrupts_does_not_stop_the_loop(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Not every task on the shared loop comes through run_sync: one started
    directly on it that raises KeyboardInterrupt is logged, and the loop lives."""
    from toolservices._portal import get_loop

    async def interrupt() -> None:
        raise KeyboardInterrupt

    loop = get_loop()
    done = threading.Event()

    def finished(task: asyncio.Task[None]) -> None:
        assert isinstance(task.exception(), KeyboardInterrupt)
        done.set()

    def start() -> None:
        loop.create_task(interrupt()).add_done_callback(finished)

    with caplog.at_level("ERROR", logger="toolservices.portal"):
        loop.call_soon_threadsafe(start)
        assert done.wait(30)
        _still_working()
    assert any("KeyboardInterrupt escaped" in r.getMessage() for r in caplog.records)


async def test_tool_acall_outside_the_dispatcher_turns_an_exit_into_an_error() -> None:
    """``Tool.acall`` of a sync tool, called directly: the exit comes back as a
    ToolExecutionError instead of reaching (and stopping) the caller's loop."""
    from toolservices.errors import ToolExecutionError

    with pytest.raises(ToolExecutionError, match="SystemExit: 3") as caught:
        await in_thread.acall(kind="exit")
    assert isinstance(caught.value.__cause__, SystemExit)
    with pytest.raises(KeyError):  # ordinary exceptions are left as they are
        await in_thread.acall(kind="no such kind")


def test_the_python_executor_still_answers_after_a_tool_exited() -> None:
    """The issue's symptom: after a tool's exit every sync call hung, the executor's too."""
    from toolservices.python import PythonExecutorService

    (outcome,) = returns(
        lambda: Dispatcher(REGISTRY).run([[ToolCall("on_loop", {"kind": "exit"})]])
    )
    assert outcome.results[0].error_kind == "tool_failed"
    with PythonExecutorService(pool_size=1, timeout=30) as executor:
        result = returns(lambda: executor.execute("print(6 * 7)"))
    assert result["success"] and result["stdout"].strip() == "42"
