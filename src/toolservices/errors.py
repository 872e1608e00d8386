"""The three kinds of error, kept apart.

* :class:`ToolError` and its subclasses describe something the *model* did or
  caused (bad arguments, an unknown tool, a crashing or slow tool). They are
  never raised out of a step: the dispatcher turns them into a failed
  :class:`~toolservices.dispatch.CallResult` whose message the model reads.
* :class:`UserError` is the *developer's* mistake (a tool whose signature
  cannot be described, an unknown parser or backend name). It is raised at
  construction time and names the valid options.
* :class:`InfrastructureError` is a failure of the machinery itself (a dead
  interpreter, a lost Ray actor, a closed MCP connection). It is typed and
  says whether retrying may help.
"""

from __future__ import annotations

from typing import Literal

__all__ = [
    "ErrorKind",
    "ExecutorBusyError",
    "InfrastructureError",
    "SandboxUnavailableError",
    "ServiceExistsError",
    "ServiceNotFoundError",
    "ServiceTimeoutError",
    "ServiceUnavailableError",
    "ToolArgumentError",
    "ToolBusyError",
    "ToolDefinitionError",
    "ToolError",
    "ToolExecutionError",
    "ToolNotFoundError",
    "ToolServicesError",
    "ToolTimeoutError",
    "UserError",
    "describe_exception",
]


#: Why a call failed, as a :class:`~toolservices.dispatch.CallResult` says it: a
#: :class:`ToolError` kind, or what the dispatcher itself decided. ``internal``
#: is a bug in this library (logged with its traceback), never the model's fault.
ErrorKind = Literal[
    "tool_error",
    "unknown_tool",
    "invalid_arguments",
    "tool_failed",
    "timeout",
    "parse_error",
    "skipped",
    "infrastructure",
    "internal",
]


class ToolServicesError(Exception):
    """Base class of every exception this library raises on purpose."""


# --- what the model should see ------------------------------------------------


class ToolError(ToolServicesError):
    """A failure the model caused or can act on; rendered into a tool result.

    ``kind`` is a short machine-readable label used in metrics and results.
    """

    kind: ErrorKind = "tool_error"

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class ToolNotFoundError(ToolError, KeyError):
    """The model named a tool that does not exist.

    Subclasses :class:`KeyError` so that ``ToolRegistry.get`` keeps the
    contract's exception type.
    """

    kind = "unknown_tool"

    def __str__(self) -> str:  # KeyError would otherwise repr() the message
        return self.message


class ToolArgumentError(ToolError):
    """The arguments do not match the tool's JSON Schema."""

    kind = "invalid_arguments"


class ToolExecutionError(ToolError):
    """The tool ran and raised; the message is the tool's own."""

    kind = "tool_failed"


class ToolTimeoutError(ToolError):
    """The tool did not finish within its time limit."""

    kind = "timeout"


# --- what the developer did wrong ----------------------------------------------


class UserError(ToolServicesError, ValueError):
    """A mistake in how the library is used; raised at construction time."""


class ToolDefinitionError(UserError):
    """A function cannot be turned into a tool; lists every problem at once."""


# --- infrastructure --------------------------------------------------------------


class InfrastructureError(ToolServicesError, RuntimeError):
    """A failure of the machinery, not of the model or the developer.

    ``retryable`` says whether the same request may succeed if sent again
    (for example after a worker was restarted).
    """

    def __init__(self, message: str, *, retryable: bool = False) -> None:
        super().__init__(message)
        self.message = message
        self.retryable = retryable


class ServiceUnavailableError(InfrastructureError):
    """A registered service is gone (its process or actor died)."""


class ServiceTimeoutError(InfrastructureError):
    """A call to a registered service did not answer within the client's timeout.

    The call was cancelled on our side; the service itself may still be alive.
    """


class ServiceExistsError(UserError):
    """A service registry already holds a service under this name."""


class ServiceNotFoundError(ToolServicesError, KeyError):
    """A service registry holds no service under this name (a ``KeyError``)."""

    def __str__(self) -> str:  # KeyError would otherwise repr() the message
        return str(self.args[0]) if self.args else ""


class ExecutorBusyError(InfrastructureError):
    """The executor refused a call: its queue is full or every session is busy.

    Always ``retryable``: the same call can succeed once load drops.
    """

    def __init__(self, message: str, *, retryable: bool = True) -> None:
        super().__init__(message, retryable=retryable)


class ToolBusyError(InfrastructureError):
    """The dispatcher refused to start a sync tool: too many of its earlier calls
    timed out and are still running in their threads (which Python cannot kill).

    Always ``retryable``: the tool is accepted again as those calls finish.
    """

    def __init__(self, message: str, *, retryable: bool = True) -> None:
        super().__init__(message, retryable=retryable)


class SandboxUnavailableError(InfrastructureError):
    """The isolation level a sandbox configuration requires cannot be reached here.

    Raised when an executor starts, with the reason of every level that failed;
    ``retryable`` is False (the machine will not change by itself).
    """


def describe_exception(exc: BaseException) -> str:
    """``Type: message`` for an exception (``Type`` alone when the message is empty).

    Never raises: an exception whose ``__str__`` fails is still described, so
    a broken exception class cannot turn one failed call into a crashed step.
    """
    name = type(exc).__name__
    try:
        message = str(exc)
    except BaseException as failure:  # even a __str__ that calls sys.exit()
        if isinstance(failure, KeyboardInterrupt) and _in_main_thread():
            raise  # may be a real Ctrl-C
        message = f"<str() of the exception failed: {type(failure).__name__}>"
    return f"{name}: {message}" if message else name


def _in_main_thread() -> bool:
    import threading

    return threading.current_thread() is threading.main_thread()
