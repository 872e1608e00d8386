"""PythonInterpreter on real ChatEnvs: every mode keeps (or not) each item's variables."""

from __future__ import annotations

import gc
import uuid
import weakref
from collections.abc import Iterator
from typing import Any

import pytest
from torchrl.envs import TransformedEnv
from torchrl.envs.llm import ChatEnv
from torchrl.envs.llm.transforms import PythonInterpreter as TorchRLPython

from toolservices import get_services
from toolservices.torchrl import PythonExecutorService, PythonInterpreter


def block(code: str) -> str:
    return f"Here:\n```python\n{code}\n```"


SET_AND_FAIL = block("x = 41\nprint(x + 1)") + "\nand\n" + block("raise ValueError('Test error')")


@pytest.fixture
def local_services() -> Iterator[tuple[Any, str]]:
    namespace = f"torchrl-{uuid.uuid4().hex[:8]}"
    registry = get_services("local", namespace=namespace)
    registry.register("python_executor", PythonExecutorService, pool_size=4)
    yield registry, namespace
    registry.reset()


def test_texts_match_torchrl_fresh_mode(chat: Any) -> None:
    ours = chat(PythonInterpreter(), 2)
    theirs = chat(TorchRLPython(), 2)
    for driver in (ours, theirs):
        driver.step([block("print('hello')\nprint(6 * 7)"), "no code"])
    assert ours.conversations() == theirs.conversations()
    assert ours.tool_texts(0) == ["Code block 1 executed successfully:\nhello\n42\n"]
    assert ours.roles(1)[-1] == "<none>"


def test_fresh_mode_forgets_and_reports_failures(chat: Any) -> None:
    transform = PythonInterpreter(persistent=False)
    assert transform.processes == [] and transform.python_service is None
    driver = chat(transform, 2)
    driver.step([SET_AND_FAIL, "nothing"])
    first, second = driver.tool_texts(0)
    assert first == "Code block 1 executed successfully:\n42\n"
    assert second.startswith("Code block 2 failed:\n") and "ValueError: Test error" in second
    assert driver.roles(1)[-2:] == ["<none>", "<none>"]
    assert driver.metric("calls") == [2, 0] and driver.metric("failed_calls") == [1, 0]
    driver.step([block("print(x)"), block("print('ok')")])
    assert "NameError" in driver.tool_texts(0)[0]
    assert driver.tool_texts(1) == ["Code block 1 executed successfully:\nok\n"]


def test_persistent_mode_keeps_each_items_variables(chat: Any) -> None:
    transform = PythonInterpreter(persistent=True)
    driver = chat(transform, 3)
    driver.step([block(f"x = {i * 10}") for i in range(3)])
    driver.step([block("x += 1"), "thinking", block("x += 2")])
    driver.step([block("print(x)")] * 3)
    assert [driver.tool_texts(i) for i in range(3)] == [
        ["Code block 1 executed successfully:\n1\n"],
        ["Code block 1 executed successfully:\n10\n"],
        ["Code block 1 executed successfully:\n22\n"],
    ]
    assert transform.processes is not None and len(transform.processes) == 3


def test_partial_reset_ends_only_the_masked_items_interpreters(chat: Any) -> None:
    driver = chat(PythonInterpreter(persistent=True), 4)
    driver.step([block(f"v = {i}") for i in range(4)])
    driver.reset_items([False, True, False, True])
    driver.step([block("print(v)")] * 4)
    assert driver.tool_texts(0) == ["Code block 1 executed successfully:\n0\n"]
    assert driver.tool_texts(2) == ["Code block 1 executed successfully:\n2\n"]
    for i in (1, 3):
        assert "NameError" in driver.tool_texts(i)[0]


def test_full_reset_ends_every_interpreter(chat: Any) -> None:
    driver = chat(PythonInterpreter(persistent=True), 2)
    driver.step([block("v = 1")] * 2)
    driver.reset()
    driver.step([block("print(v)")] * 2)
    assert all("NameError" in driver.tool_texts(i)[0] for i in range(2))


def test_local_service_sessions_keyed_by_env_and_item(
    chat: Any, local_services: tuple[Any, str]
) -> None:
    registry, namespace = local_services
    service = registry.get("python_executor")
    first = PythonInterpreter(services="local", namespace=namespace)
    other_env = PythonInterpreter(services="local", namespace=namespace)
    assert first.python_service is service and first.processes is None and first.persistent
    a, b = chat(first, 2), chat(other_env, 2)
    a.step([block("x = 'a0'"), block("x = 'a1'")])
    b.step([block("x = 'b0'"), block("x = 'b1'")])
    a.step([block("print(x)")] * 2)
    b.step([block("print(x)")] * 2)
    assert [a.tool_texts(i)[0].split("\n")[1] for i in range(2)] == ["a0", "a1"]
    assert [b.tool_texts(i)[0].split("\n")[1] for i in range(2)] == ["b0", "b1"]
    assert service.stats()["sessions"] == 4
    a.reset_items([True, False])
    assert service.stats()["sessions"] == 3
    first.close()
    other_env.close()
    assert service.stats()["sessions"] == 0  # the shared service itself keeps running


def test_service_mode_persistent_false_runs_fresh(
    chat: Any, local_services: tuple[Any, str]
) -> None:
    _, namespace = local_services
    driver = chat(PythonInterpreter(services="local", namespace=namespace, persistent=False), 1)
    driver.step([block("x = 1")])
    driver.step([block("print(x)")])
    assert "NameError" in driver.tool_texts(0)[0]


def test_blocks_of_items_run_concurrently(chat: Any) -> None:
    driver = chat(PythonInterpreter(persistent=True), 4)
    driver.step([block("import time")] * 4)  # warm up: sessions exist
    # Each block reports when it started and ended (the host clock): all four
    # intervals share a moment only if the blocks ran at the same time. Run in
    # turn they would be disjoint, whatever the load; the 1.5 s sleep is only
    # the slack for starting the four at slightly different times.
    driver.step([block("s = time.time()\ntime.sleep(1.5)\nprint(s, time.time())")] * 4)
    prefix = "Code block 1 executed successfully:\n"
    spans = []
    for i in range(4):
        (text,) = driver.tool_texts(i)
        assert text.startswith(prefix), text
        start, end = map(float, text.removeprefix(prefix).split())
        spans.append((start, end))
    assert max(s for s, _ in spans) < min(e for _, e in spans), spans


def test_timeout_is_a_failed_block_and_counted(chat: Any) -> None:
    driver = chat(PythonInterpreter(persistent=True, timeout=1.0), 2)
    driver.step([block("y = 5"), block("y = 6")])
    driver.step([block("while True: pass"), block("print(y)")])
    assert driver.tool_texts(0)[0].startswith("Code block 1 failed:\n")
    assert driver.metric("timeouts") == [1, 0]
    assert driver.tool_texts(1) == ["Code block 1 executed successfully:\n6\n"]


def test_contract_errors() -> None:
    with pytest.raises(ValueError, match="Invalid services backend"):
        PythonInterpreter(services="bogus")
    with pytest.raises(RuntimeError, match="Failed to get Ray service"):
        PythonInterpreter(services="local", service_name=f"missing-{uuid.uuid4().hex[:6]}")


def test_clone_keeps_settings_and_execute_method() -> None:
    transform = PythonInterpreter(persistent=True, timeout=3.0, tool_name="python")
    twin = transform.clone()
    try:
        assert (twin.persistent, twin.timeout, twin.tool_role) == (True, 3.0, "python")
        assert twin.env_key != transform.env_key
        result = transform._execute_python_code("a = 2\nprint(a * 21)", 0)
        assert result["success"] and result["stdout"] == "42\n" and result["returncode"] == 0
        assert transform._execute_python_code("print(a)", 0)["stdout"] == "2\n"
    finally:
        transform.close()
        twin.close()
    failed = transform._execute_python_code("print(1)", 0)
    assert not failed["success"] and "closed" in failed["stderr"]


def test_garbage_collected_env_ends_its_interpreters() -> None:
    transform = PythonInterpreter(persistent=True)
    executor = transform._runner.executor
    assert executor is not None
    env = TransformedEnv(ChatEnv(batch_size=(2,)), transform)
    for i in range(2):
        assert transform._execute_python_code("z = 1", i)["success"]
    assert executor.stats()["sessions"] == 2
    ref = weakref.ref(transform)
    del env, transform
    gc.collect()
    assert ref() is None
    assert executor.stats()["sessions"] == 0


def _head_and_tail(text: str) -> tuple[list[str], str]:
    lines = text.rstrip("\n").split("\n")
    return lines[:4], lines[-1]


@pytest.mark.parametrize("mode", ["persistent", "service"])
def test_failed_block_has_torchrl_error_header(
    chat: Any, mode: str, local_services: tuple[Any, str]
) -> None:
    """TorchRL's persistent interpreters print ``Error: <message>`` and ``Traceback:``
    before the traceback (its own TestTools pins that shape)."""
    if mode == "service":
        transform = PythonInterpreter(services="local", namespace=local_services[1])
    else:
        transform = PythonInterpreter(persistent=True)
    driver = chat(transform, 1)
    driver.step([block("raise ValueError('This is an error')")])
    assert _head_and_tail(driver.tool_texts(0)[0]) == (
        [
            "Code block 1 failed:",
            "Error: This is an error",
            "Traceback:",
            "Traceback (most recent call last):",
        ],
        "ValueError: This is an error",
    )
    assert driver.metric("failed_calls") == [1]


def test_error_header_goes_just_before_the_traceback() -> None:
    from toolservices.python import ExecResult
    from toolservices.python.host._result import ExceptionInfo
    from toolservices.torchrl.python import with_error_header

    chained = (
        "Traceback (most recent call last):\n  ...\nZeroDivisionError: division by zero\n\n"
        "The above exception was the direct cause of the following exception:\n\n"
        "Traceback (most recent call last):\n  ...\nKeyError: 'k'\n"
    )
    printed = "a warning the code printed\n"

    def failed(stderr: str, exc: ExceptionInfo | None) -> ExecResult:
        return ExecResult(success=False, stdout="", stderr=stderr, returncode=1, exception=exc)

    key = ExceptionInfo(type="KeyError", message="'k'")
    result = with_error_header(failed(printed + chained, key))
    assert result.stderr == printed + "Error: 'k'\nTraceback:\n" + chained
    # Nothing raised (sys.exit), or no traceback to put it before: the text is kept.
    exit_only = failed("", ExceptionInfo(type="SystemExit", message="3"))
    assert with_error_header(exit_only) is exit_only
    no_exception = failed("killed\n", None)
    assert with_error_header(no_exception) is no_exception


def test_fresh_mode_error_has_the_header_too(chat: Any) -> None:
    driver = chat(PythonInterpreter(), 1)
    driver.step([block("import sys\nprint('note', file=sys.stderr)\n1 / 0")])
    text = driver.tool_texts(0)[0]
    assert text.startswith(
        "Code block 1 failed:\nnote\nError: division by zero\nTraceback:\n"
        "Traceback (most recent call last):\n"
    )
    assert text.endswith("ZeroDivisionError: division by zero\n")
