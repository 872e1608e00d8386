"""The host's half of the Python tool on a shell session (the session's half: ``_pyworker``).

``ShellService.arun_python`` sends the code as a ``python`` request to the
session's supervisor, which runs it in the session's own interpreter, and
turns the reply into the executor's :class:`~toolservices.ExecResult`, so a
Python tool reads it exactly as it reads the executor's.
"""

from __future__ import annotations

import base64
import functools
from typing import TYPE_CHECKING, Any

from toolservices.errors import UserError
from toolservices.python import ExceptionInfo, ExecResult
from toolservices.shell._checks import checked, died

if TYPE_CHECKING:
    from toolservices.shell._service import ShellService

__all__ = ["arun_python", "forget_python", "python_config"]

#: the fields of a reply to a ``python`` request that ran (or tried to run) the code
_FIELDS = {
    "restarted": bool,
    "timed_out": bool,
    "limit": float,
    "stdout": str,
    "stderr": str,
    "stdout_total": int,
    "stderr_total": int,
}
_LOST = " The interpreter was restarted: variables defined earlier are lost."
_SHELL_GOES_ON = " (Only Python's: the shell session, its files and its processes go on.)"


@functools.cache
def _runtime_zip() -> str:
    """The runtime as the zip an image's python3 runs (base64; made once per process)."""
    from toolservices.python.runtime import runtime_zip_bytes

    return base64.b64encode(runtime_zip_bytes()).decode()


def python_config(image: Any) -> str | None:
    """The ``python`` entry of the supervisor's config: None without an image (the
    interpreter is forked from the supervisor), else the image's ``python3`` ("" if none)."""
    if image is None:
        return None
    return str(image.which("python3") or "")


async def arun_python(
    service: ShellService, code: object, session_id: object, timeout: object, inline: bool
) -> ExecResult:
    """Run ``code`` in the Python interpreter of shell session ``session_id`` (``inline``:
    the executor's sync face, see ``SupervisorRequests._execute``)."""
    if not isinstance(code, str):
        raise UserError(f"code must be a str, got {type(code).__name__}")
    session, limit, wait = service._python_args(session_id, timeout)
    args: dict[str, Any] = {"code": code, "timeout": limit}
    res, lost = await service._request("python", args, session, wait, inline)
    if not (res.timed_out or died(res)):
        reply = service._reply(res)
        if reply.get("need_runtime"):  # an image session's first Python: it gets the runtime
            args["runtime"] = _runtime_zip()
            res, again = await service._request("python", args, session, wait, inline)
            lost = lost or again
    if res.timed_out or died(res):  # the supervisor did not answer: the whole session is gone
        what = "did not answer in time" if res.timed_out else "ended during the call"
        return ExecResult(
            success=False,
            stdout="",
            stderr=f"[the shell session {what}; it was restarted: its files, shell state and "
            "Python variables are lost]\n",
            returncode=-1,
            exception=ExceptionInfo(type="InterpreterExit", message=f"the shell session {what}"),
            duration=res.duration,
            timed_out=res.timed_out,
            restarted=session is not None,
            session_id=session,
        )
    reply = service._reply(res)
    if not reply.get("ok"):  # no interpreter could start (no python3, too old...)
        message = str(reply.get("message"))
        return ExecResult(
            success=False,
            stdout="",
            stderr=f"{message}\n",
            returncode=-1,
            exception=ExceptionInfo(type="PythonUnavailable", message=message),
            restarted=False,
            session_id=session,
        )
    return _result(checked(reply, _FIELDS), lost and session is not None, session, service)


def _text(data: str, total: int, dropped: int, cap: int) -> tuple[str, bool]:
    """A stream as the interpreter kept it, with the executor's marker past the cap."""
    omitted = max(0, total - cap) + dropped
    text = base64.b64decode(data).decode("utf-8", "replace")
    if omitted:
        text += f"\n[... output truncated: {omitted} more bytes not shown ...]\n"
    return text, bool(omitted)


def _result(
    reply: dict[str, Any], lost: bool, session: str | None, service: ShellService
) -> ExecResult:
    cap = service.max_output
    dropped = reply.get("dropped") or [0, 0]
    out, cut_out = _text(reply["stdout"], reply["stdout_total"], int(dropped[0]), cap)
    err, cut_err = _text(reply["stderr"], reply["stderr_total"], int(dropped[1]), cap)
    restarted = (reply["restarted"] or lost) and session is not None
    common: dict[str, Any] = {
        "stdout": out,
        "duration": float(reply.get("dur", 0.0)),
        "truncated": cut_out or cut_err,
        "restarted": restarted,
        "session_id": session,
    }
    if err and not err.endswith("\n"):
        err += "\n"
    lost_note = (_LOST if session is not None else "") + _SHELL_GOES_ON
    if reply["timed_out"]:
        limit = reply["limit"]
        message = f"execution exceeded the {limit:g} s time limit"
        return ExecResult(
            success=False,
            stderr=f"{err}TimeoutError: {message} and was killed.{lost_note}\n",
            returncode=-1,
            exception=ExceptionInfo(type="TimeoutError", message=message),
            timed_out=True,
            **common,
        )
    problem = reply.get("problem")
    if problem:
        status = reply.get("status")
        return ExecResult(
            # os._exit(0) is a clean exit, as in the executor
            success=status == 0,
            stderr=f"{err}InterpreterExit: {problem}.{lost_note}\n",
            returncode=status if isinstance(status, int) else -1,
            exception=ExceptionInfo(type="InterpreterExit", message=str(problem)),
            **common,
        )
    exc = reply.get("exc")
    rc = int(reply.get("rc", 0))
    return ExecResult(
        success=rc == 0,
        stderr=err,
        returncode=rc,
        exception=ExceptionInfo(type=str(exc["type"]), message=str(exc["message"]))
        if isinstance(exc, dict)
        else None,
        **common,
    )


async def forget_python(service: ShellService, src: str, copies: list[str]) -> None:
    """``fork_session``: when ``src`` has had an interpreter, each copy's first Python call
    says its interpreter is a new one (an interpreter cannot be copied into a new session)."""
    _, _, wait = service._python_args(src, None)
    res, _ = await service._request("python_status", {}, src, wait, False)
    if not service._reply(res, {"started": bool})["started"]:
        return
    for copy in copies:
        res, _ = await service._request("python_forget", {}, copy, wait, False)
        service._reply(res)
