"""``python_tool``: model-written Python, run in the calling episode's own session.

The tool itself holds no session: an :class:`~toolservices.env.Episode` puts
its session id into the call's ``_state`` (``"python_session"``), so one tool
object serves every episode and each episode keeps its own variables and
working directory. Without a session id (a plain dispatcher call) the code
runs in a fresh interpreter.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from toolservices.errors import ToolExecutionError, ToolTimeoutError
from toolservices.tools import Tool

if TYPE_CHECKING:
    from toolservices.python import ExecResult, PythonExecutorService

__all__ = ["PYTHON_SESSION_KEY", "PythonTool", "exec_result_text", "python_tool"]

#: The ``_state`` key that carries the episode's session id.
PYTHON_SESSION_KEY = "python_session"
#: Seconds the dispatcher waits beyond the executor's own limit, so that the
#: executor (which kills the process tree and says so) reports the timeout.
TIMEOUT_GRACE = 5.0
_RESTART_NOTE = "\n[the interpreter was restarted: earlier variables are gone]"


def exec_result_text(result: ExecResult, *, with_stderr: bool = True) -> str:
    """What the model reads for a successful run; raises the model-visible errors.

    A timeout raises :class:`ToolTimeoutError` (the executor's message says
    the state was lost), a failed run :class:`ToolExecutionError` with the
    traceback; otherwise a note says when the interpreter was restarted.
    """
    if result.timed_out:
        raise ToolTimeoutError(result.stderr or "Code execution timed out; its state was lost")
    note = _RESTART_NOTE if result.restarted else ""
    if not result.success:
        raise ToolExecutionError(result.stderr + note)
    text = result.stdout
    if with_stderr and result.stderr:
        text += ("\n" if text and not text.endswith("\n") else "") + "[stderr]\n" + result.stderr
    return text + note


class PythonTool(Tool):
    """The ``python(code)`` tool; see :func:`python_tool`."""

    schema_out: dict[str, Any] = {}
    accepts_state = True
    is_async = True

    def __init__(
        self,
        executor: PythonExecutorService,
        *,
        name: str = "python",
        description: str | None = None,
    ) -> None:
        self.executor = executor
        self.name = name
        self.description = description or (
            "Run Python code in a persistent interpreter: variables, imports and files "
            "in the working directory are kept between calls. Returns what the code "
            "prints (use print() to see values)."
        )
        self.schema_in = {
            "type": "object",
            "properties": {"code": {"type": "string", "description": "Python source to run."}},
            "required": ["code"],
        }
        limit = getattr(executor, "timeout", None)
        self.timeout = float(limit) + TIMEOUT_GRACE if limit is not None else None

    def __call__(self, **kwargs: Any) -> Any:
        raise TypeError(f"tool '{self.name}' is async: use 'await tool.acall(...)'")

    async def acall(self, **kwargs: Any) -> Any:
        state = kwargs.get("_state") or {}
        session = state.get(PYTHON_SESSION_KEY)
        result = await self.executor.aexecute(kwargs["code"], session_id=session)
        return exec_result_text(result)


def python_tool(
    executor: PythonExecutorService, *, name: str = "python", description: str | None = None
) -> PythonTool:
    """A tool ``python(code: str)`` that runs ``code`` in the calling episode's session.

    ``Episode(python=executor)`` (or an episode whose tools include this tool,
    which then defaults ``python`` to ``executor``) gives each episode its own
    interpreter; outside an episode each call runs in a fresh interpreter.
    The call's time limit is the executor's ``timeout`` plus a grace period,
    so the executor kills a runaway snippet and the model reads why.
    """
    return PythonTool(executor, name=name, description=description)
