"""Runaway recursion and memory: each ends fast, the same way every time, and the next call works.

Python recursion is bounded by a cap on ``sys.setrecursionlimit`` (CPU), C
recursion by the stack limit (a crash the executor reports and recovers
from), memory by the address-space limit. Each case runs with a timeout far
above what it needs and asserts it was not reached: before these limits, a
million-deep ``repr`` ran until the timeout.
"""

from __future__ import annotations

import pytest

from toolservices.python import ExecResult, PythonExecutorService

RAISED_LIMIT = "import sys\nsys.setrecursionlimit(10**6)\n"
NESTED = "x = []\nfor _ in range(10**6):\n    x = [x]\n"
GENEROUS = 60.0  # seconds: each case needs a few at most, even on a loaded 2-core machine


def _next_call_works(service: PythonExecutorService, sid: str, result: ExecResult) -> None:
    """The session answers after ``result``; its state survived unless the result said so."""
    after = service.execute("print(kept)", session_id=sid)
    if result.restarted:
        assert after.exception is not None and after.exception.type == "NameError", after
    else:
        assert after.stdout == "1\n", after
    assert service.execute("print(2 + 2)", session_id=sid).stdout == "4\n"
    service.close_session(sid)


# --- Python recursion: the cap on sys.setrecursionlimit ----------------------------------


@pytest.mark.parametrize("limit", [10**6, 10**9])
def test_python_recursion_ends_in_recursion_error(
    service: PythonExecutorService, sid: str, limit: int
) -> None:
    service.execute("kept = 1", session_id=sid)
    code = f"import sys\nsys.setrecursionlimit({limit})\ndef f(n):\n    return f(n + 1)\nf(0)"
    result = service.execute(code, session_id=sid, timeout=GENEROUS)
    assert not result.timed_out and not result.restarted, result.stderr[-500:]
    assert result.exception is not None and result.exception.type == "RecursionError", result
    assert "earlier frames not shown" in result.stderr and len(result.stderr) < 50_000
    honoured = service.execute("print(sys.getrecursionlimit())", session_id=sid)
    assert int(honoured.stdout) == 500_000  # the cap: ~1 s of CPU to unwind (sandbox.md)
    _next_call_works(service, sid, result)


def test_a_limit_below_the_cap_is_honoured(service: PythonExecutorService, sid: str) -> None:
    code = "import sys\nsys.setrecursionlimit(123_456)\nprint(sys.getrecursionlimit())"
    assert service.execute(code, session_id=sid).stdout == "123456\n"
    service.close_session(sid)


def test_deep_traceback_is_cut_to_its_innermost_frames(
    service: PythonExecutorService, sid: str
) -> None:
    code = RAISED_LIMIT + "def f(n):\n    return f(n + 1) if n < 5000 else 1 / 0\nf(0)"
    result = service.execute(code, session_id=sid)
    assert result.exception is not None and result.exception.type == "ZeroDivisionError"
    assert "[... 4902 earlier frames not shown ...]" in result.stderr
    assert result.stderr.count("line 5, in f") <= 2  # repeats folded, tail only
    assert result.stderr.rstrip().endswith("ZeroDivisionError: division by zero")
    service.close_session(sid)


# --- C recursion: the stack limit -------------------------------------------------------


@pytest.mark.parametrize(
    "operation",
    [
        pytest.param("repr(x)", id="repr"),
        pytest.param("str(x)", id="str"),
        pytest.param("import json\njson.dumps(x)", id="json"),
        pytest.param("import pickle\npickle.dumps(x)", id="pickle"),
        pytest.param("y = []\nfor _ in range(10**6):\n    y = [y]\nx == y", id="compare"),
        pytest.param(
            "import threading\nthreading.stack_size(1 << 29)\n"
            "t = threading.Thread(target=repr, args=(x,))\nt.start()\nt.join()",
            id="repr-in-a-big-thread",
        ),
    ],
)
def test_deep_c_recursion_ends_fast_and_the_session_recovers(
    service: PythonExecutorService, sid: str, operation: str
) -> None:
    """A RecursionError, or a crash reported as one (restarted): never the timeout.

    Before the stack limit, the repr cases ran until the timeout (``repr`` of
    nested lists is quadratic in the depth).
    """
    service.execute("kept = 1", session_id=sid)
    result = service.execute(RAISED_LIMIT + NESTED + operation, session_id=sid, timeout=GENEROUS)
    assert not result.timed_out, result.stderr[-500:]
    assert result.exception is not None, result
    if result.exception.type != "RecursionError":
        assert result.exception.type == "InterpreterExit" and result.returncode == -11, result
        assert "C stack" in result.exception.message and result.restarted
        if "Thread" not in operation:  # faulthandler's alternate stack is the main thread's
            assert "Fatal Python error: Segmentation fault" in result.stderr
    _next_call_works(service, sid, result)


def test_lru_cache_recursion_ends_fast(service: PythonExecutorService) -> None:
    code = (
        RAISED_LIMIT + "import functools\n@functools.lru_cache(None)\n"
        "def g(n):\n    return 0 if n == 0 else g(n - 1) + 1\ng(10**6)"
    )
    result = service.execute(code, timeout=GENEROUS)
    assert not result.timed_out and result.exception is not None, result
    assert result.exception.type in ("RecursionError", "InterpreterExit"), result


def test_c_recursion_within_the_stack_still_works(service: PythonExecutorService) -> None:
    """What a default 8 MiB stack holds on a plain interpreter works here too."""
    code = (
        "import json, sys\nsys.setrecursionlimit(100_000)\nx = []\nfor _ in range(20_000):\n"
        "    x = [x]\nprint(len(repr(x)), len(json.dumps(x)), x == x)"
    )
    result = service.execute(code, timeout=GENEROUS)
    assert result.stdout == "40002 40002 True\n", result


def test_threads_get_no_bigger_stack_than_the_main_thread(service: PythonExecutorService) -> None:
    code = (
        "import resource, threading\nthreading.stack_size(1 << 29)\n"
        "print(threading.stack_size() == resource.getrlimit(resource.RLIMIT_STACK)[0] == 8 << 20)"
    )
    assert service.execute(code).stdout == "True\n"
