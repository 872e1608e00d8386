"""The shapes of the judge's answers: SandboxFusion's step results and responses, and
the verdicts of ``run_tests``. One place, used by the judge and by the server's errors."""

from __future__ import annotations

import re
from typing import Any

from toolservices.judge._compare import outputs_match

__all__ = [
    "code_response",
    "jupyter_response",
    "overall",
    "step",
    "tests_response",
    "verdict",
]

#: the notes our shell and executor append, which SandboxFusion's answers do not carry
_NOTES = re.compile(
    r"(?:\n\[timed out after [^\]\n]*\]\n"
    r"|TimeoutError: execution exceeded the [^\n]* time limit and was killed\.\n"
    r"|InterpreterExit: the interpreter exited with status -?\d+\.\n)\Z"
)
_CUT_NOTE = re.compile(r"\n\[\.\.\. output truncated: \d+ more bytes not shown \.\.\.\]\n\Z")
#: stderr fragments of an allocation refused under RLIMIT_AS, per runtime
_OOM = (
    "MemoryError",
    "std::bad_alloc",
    "OutOfMemoryError",
    "memory allocation of",
    "out of memory",
    "Cannot allocate memory",
    "JavaScript heap out of memory",
)


def step(
    status: str,
    *,
    time: float | None = None,
    rc: int | None = None,
    out: str | None = None,
    err: str | None = None,
) -> dict[str, Any]:
    """SandboxFusion's ``CommandRunResult`` (our own notes taken off the output)."""
    if out is not None:
        out = _CUT_NOTE.sub("", out)
    if err is not None:
        err = _CUT_NOTE.sub("", _NOTES.sub("", err))
    return {
        "status": status,
        "execution_time": time,
        "return_code": None if status == "TimeLimitExceeded" else rc,
        "stdout": out,
        "stderr": err,
    }


def overall(
    compile_result: dict[str, Any] | None, run_result: dict[str, Any] | None
) -> tuple[str, str]:
    """SandboxFusion's status: SandboxError, Failed (a timeout or non-zero exit), Success."""
    steps = [r for r in (compile_result, run_result) if r is not None]
    for one in steps:
        if one["status"] == "Error":
            return "SandboxError", one["stderr"] or ""
    if any(s["status"] == "TimeLimitExceeded" for s in steps):
        return "Failed", ""
    if any(s["return_code"] not in (None, 0) for s in steps):
        return "Failed", ""
    return "Success", ""


def code_response(status: str, message: str, **fields: Any) -> dict[str, Any]:
    """``/run_code``'s answer."""
    return {
        "status": status,
        "message": message,
        "compile_result": fields.get("compile_result"),
        "run_result": fields.get("run_result"),
        "executor_pod_name": None,
        "files": fields.get("files", {}),
    }


def jupyter_response(status: str, message: str = "", **fields: Any) -> dict[str, Any]:
    """``/run_jupyter``'s answer."""
    return {
        "status": status,
        "message": message,
        "driver": fields.get("driver"),
        "cells": fields.get("cells", []),
        "executor_pod_name": None,
        "files": fields.get("files", {}),
    }


def tests_response(
    status: str,
    message: str,
    compile_result: dict[str, Any] | None = None,
    cases: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """``/run_tests``' answer."""
    cases = cases or []
    return {
        "status": status,
        "message": message,
        "compile_result": compile_result,
        "cases": cases,
        "accepted": sum(c["verdict"] == "accepted" for c in cases),
        "total": len(cases),
    }


def verdict(run: dict[str, Any], expected: str | None, tolerance: float | None) -> str:
    """A case's verdict from its run step and the expected output."""
    if run["status"] == "TimeLimitExceeded":
        return "time_limit"
    if run["status"] == "Error":
        return "sandbox_error"
    if run["return_code"] != 0:
        err = run["stderr"] or ""
        return "memory_limit" if any(s in err for s in _OOM) else "runtime_error"
    if expected is not None and not outputs_match(
        run["stdout"] or "", expected, float_tolerance=tolerance
    ):
        return "wrong_answer"
    return "accepted"
