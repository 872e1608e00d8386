"""``python_tool``: model-written Python, run in the calling episode's own session.

:class:`PythonTool` is the library's one Python tool: episodes and
``ToolEnv`` use it as ``python_tool(executor)``, TorchRL's
``PythonInterpreter`` with ``render="stdout"`` and a per-item session, the
MCP server as ``python_execute`` with ``render="result"`` and sessions the
model names.

The tool itself holds no session: an :class:`~toolservices.env.Episode` puts
its session id into the call's ``_state`` (``"python_session"``), so one tool
object serves every episode and each episode keeps its own variables and
working directory. Without a session id (a plain dispatcher call) the code
runs in a fresh interpreter.

``python_tool(shell=service)`` runs the code in the interpreter of the
episode's *shell* session instead (``ShellService.arun_python``): one
environment for the episode's Python and shell tools, the same root,
workspace, ``/tmp`` and network, so a file one writes the other sees. The
schema the model sees is the same.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal

from toolservices.env._shell_tools import SHELL_SESSION_KEY
from toolservices.errors import ToolExecutionError, ToolTimeoutError, UserError
from toolservices.tools import Tool

if TYPE_CHECKING:
    from toolservices.python import ExecResult, PythonExecutorService
    from toolservices.shell import ShellService

__all__ = [
    "PYTHON_SESSION_KEY",
    "PythonRender",
    "PythonTool",
    "exec_result_text",
    "python_tool",
]

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


#: How a run reads to the model: ``text`` (stdout, then any stderr under a
#: ``[stderr]`` line; failures and timeouts are failed calls), ``stdout``
#: (stdout alone, TorchRL's text; failures as with ``text``) or ``result``
#: (the whole result mapping: ``success``, ``stdout``, ``stderr``... as JSON
#: and MCP structured content; a failed run is a successful call).
PythonRender = Literal["text", "stdout", "result"]
_RENDERS: tuple[PythonRender, ...] = ("text", "stdout", "result")


class PythonTool(Tool):
    """The one ``python(code)`` tool; see :func:`python_tool`.

    ``executor`` is anything with ``async aexecute(code, *, session_id=None)``
    returning an :class:`~toolservices.ExecResult` (or, for ``render="result"``,
    any mapping): a :class:`~toolservices.PythonExecutorService`, the TorchRL
    transform's per-item runner, the MCP server's connection-scoped sessions.
    ``session`` says where the session comes from: the ``_state`` entry of
    that name (``"python_session"``: the calling episode's own session), or
    ``None``: the model names it in an optional ``session_id`` argument.
    """

    schema_out: dict[str, Any] = {}
    is_async = True
    #: the shell service whose sessions run the code (``python_tool(shell=...)``), else None
    shell: Any = None

    def __init__(
        self,
        executor: Any,
        *,
        name: str = "python",
        description: str | None = None,
        render: PythonRender = "text",
        session: str | None = PYTHON_SESSION_KEY,
    ) -> None:
        if render not in _RENDERS:
            valid = ", ".join(repr(r) for r in _RENDERS)
            raise UserError(f"Unknown render {render!r} for the python tool; valid: {valid}")
        self.executor = executor
        self.name = name
        self.render: PythonRender = render
        self.session = session
        self.accepts_state = session is not None
        self.description = description or (
            "Run Python code in a persistent interpreter: variables, imports and files "
            "in the working directory are kept between calls. Returns what the code "
            "prints (use print() to see values)."
        )
        properties: dict[str, Any] = {
            "code": {"type": "string", "description": "Python source to run."}
        }
        if session is None:
            properties["session_id"] = {
                "anyOf": [{"type": "string"}, {"type": "null"}],
                "default": None,
                "description": "Keep variables between calls that give the same id; "
                "none: a fresh interpreter.",
            }
        self.schema_in = {"type": "object", "properties": properties, "required": ["code"]}
        limit = getattr(executor, "timeout", None)
        self.timeout = float(limit) + TIMEOUT_GRACE if limit is not None else None

    @property
    def episode_sessions(self) -> bool:
        """Whether episodes give this tool their own session (and so own its executor's)."""
        return self.session == PYTHON_SESSION_KEY

    def __call__(self, **kwargs: Any) -> Any:
        raise TypeError(f"tool '{self.name}' is async: use 'await tool.acall(...)'")

    async def acall(self, **kwargs: Any) -> Any:
        if self.session is None:
            session = kwargs.get("session_id")
        else:
            session = (kwargs.get("_state") or {}).get(self.session)
        result = await self.executor.aexecute(kwargs["code"], session_id=session)
        if self.render == "result":
            return dict(result)
        return exec_result_text(result, with_stderr=self.render == "text")


class _ShellPython:
    """A shell service as the Python tool's executor: the code runs in the shell session."""

    def __init__(self, shell: ShellService) -> None:
        self.shell = shell
        self.timeout = shell.timeout

    async def aexecute(self, code: str, *, session_id: str | None = None) -> ExecResult:
        return await self.shell.arun_python(code, session_id=session_id)


def python_tool(
    executor: PythonExecutorService | None = None,
    *,
    shell: ShellService | None = None,
    name: str = "python",
    description: str | None = None,
    render: PythonRender = "text",
) -> PythonTool:
    """A tool ``python(code: str)`` that runs ``code`` in the calling episode's session.

    ``Episode(python=executor)`` (or an episode whose tools include this tool,
    which then defaults ``python`` to ``executor``) gives each episode its own
    interpreter; outside an episode each call runs in a fresh interpreter.
    The call's time limit is the executor's ``timeout`` plus a grace period,
    so the executor kills a runaway snippet and the model reads why.
    ``render`` chooses what the model reads (:data:`PythonRender`).

    ``shell=`` (a :class:`~toolservices.ShellService`, instead of ``executor``):
    the code runs in the episode's shell session, beside its ``bash``: one
    environment (root, workspace, network, processes) for both tools; see
    docs/episodes.md. The schema the model sees does not change.
    """
    if (executor is None) == (shell is None):
        raise UserError(
            "python_tool needs one of executor= (a PythonExecutorService: sessions of their "
            "own) or shell= (a ShellService: the code runs in the episode's shell session)"
        )
    if shell is None:
        return PythonTool(executor, name=name, description=description, render=render)
    if not callable(getattr(shell, "arun_python", None)):
        raise UserError(f"python_tool(shell=...) needs a ShellService, got {type(shell).__name__}")
    tool = PythonTool(
        _ShellPython(shell),
        name=name,
        description=description,
        render=render,
        session=SHELL_SESSION_KEY,
    )
    tool.shell = shell
    return tool
