"""toolservices: turn LLM output into executed tool calls, for batches of RL environments.

The core (tools, parsers, dispatch, the framework-free environment) needs no
torch. Integrations load on first use: ``toolservices.python`` (sandboxed
interpreters), ``toolservices.shell`` (sandboxed shells), ``toolservices.services``
(local and Ray registries), ``toolservices.mcp`` and ``toolservices.torchrl``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from toolservices._lazy import lazy_attributes

if TYPE_CHECKING:  # what type checkers see; at run time every name loads on first use
    from toolservices.dispatch import (
        CallResult,
        Dispatcher,
        EpisodeMetrics,
        ItemResult,
        StepMetrics,
        render_tool_results,
        to_openai_messages,
    )
    from toolservices.env import EnvStep, Episode, ToolEnv, python_tool, shell_tools
    from toolservices.errors import (
        ExecutorBusyError,
        InfrastructureError,
        SandboxUnavailableError,
        ServiceExistsError,
        ServiceNotFoundError,
        ServiceTimeoutError,
        ServiceUnavailableError,
        ToolArgumentError,
        ToolBusyError,
        ToolDefinitionError,
        ToolError,
        ToolExecutionError,
        ToolNotFoundError,
        ToolServicesError,
        ToolTimeoutError,
        UserError,
    )
    from toolservices.parsing import ParseError, ParseFailure, ParseResult, ToolCall, ToolParser
    from toolservices.tools import FunctionTool, Tool, ToolRegistry, ToolService, tool

__version__ = "0.1.0.dev0"

# Every public name loads its subpackage on first use: ``import toolservices``
# (and so ``from toolservices.parsing import get_parser``) loads neither the
# dispatcher nor pydantic.
_LAZY = {
    "CallResult": "toolservices.dispatch",
    "Dispatcher": "toolservices.dispatch",
    "EpisodeMetrics": "toolservices.dispatch",
    "ItemResult": "toolservices.dispatch",
    "StepMetrics": "toolservices.dispatch",
    "render_tool_results": "toolservices.dispatch",
    "to_openai_messages": "toolservices.dispatch",
    "EnvStep": "toolservices.env",
    "Episode": "toolservices.env",
    "ToolEnv": "toolservices.env",
    "python_tool": "toolservices.env",
    "shell_tools": "toolservices.env",
    "ExecutorBusyError": "toolservices.errors",
    "InfrastructureError": "toolservices.errors",
    "SandboxUnavailableError": "toolservices.errors",
    "ServiceExistsError": "toolservices.errors",
    "ServiceNotFoundError": "toolservices.errors",
    "ServiceTimeoutError": "toolservices.errors",
    "ServiceUnavailableError": "toolservices.errors",
    "ToolArgumentError": "toolservices.errors",
    "ToolBusyError": "toolservices.errors",
    "ToolDefinitionError": "toolservices.errors",
    "ToolError": "toolservices.errors",
    "ToolExecutionError": "toolservices.errors",
    "ToolNotFoundError": "toolservices.errors",
    "ToolServicesError": "toolservices.errors",
    "ToolTimeoutError": "toolservices.errors",
    "UserError": "toolservices.errors",
    "ParseError": "toolservices.parsing",
    "ParseFailure": "toolservices.parsing",
    "ParseResult": "toolservices.parsing",
    "ToolCall": "toolservices.parsing",
    "ToolParser": "toolservices.parsing",
    "FunctionTool": "toolservices.tools",
    "Tool": "toolservices.tools",
    "ToolRegistry": "toolservices.tools",
    "ToolService": "toolservices.tools",
    "tool": "toolservices.tools",
    "get_parser": "toolservices.parsing",
    "as_parser": "toolservices.parsing",
    "available_parsers": "toolservices.parsing",
    "XMLBlockParser": "toolservices.parsing",
    "JSONCallParser": "toolservices.parsing",
    "get_services": "toolservices.services",
    "ServiceClient": "toolservices.services",
    "ServiceRegistry": "toolservices.services",
    # TorchRL 0.14.1's names (``from torchrl.services import X``)
    "Service": "toolservices.services",
    "ServiceBase": "toolservices.services",
    "ServiceBackend": "toolservices.services",
    "RayService": "toolservices.services",
    "SandboxConfig": "toolservices.python",
    "ExecResult": "toolservices.python",
    "PythonExecutorService": "toolservices.python",
    "PersistentPythonProcess": "toolservices.python",
    "isolation_report": "toolservices.python",
    "ShellService": "toolservices.shell",
    "ShellResult": "toolservices.shell",
    "ShellFileError": "toolservices.shell",
}


__getattr__ = lazy_attributes(__name__, _LAZY)


__all__ = [
    "CallResult",
    "Dispatcher",
    "EnvStep",
    "Episode",
    "EpisodeMetrics",
    "ExecResult",
    "ExecutorBusyError",
    "FunctionTool",
    "InfrastructureError",
    "ItemResult",
    "JSONCallParser",
    "ParseError",
    "ParseFailure",
    "ParseResult",
    "PersistentPythonProcess",
    "PythonExecutorService",
    "RayService",
    "SandboxConfig",
    "SandboxUnavailableError",
    "Service",
    "ServiceBackend",
    "ServiceBase",
    "ServiceClient",
    "ServiceExistsError",
    "ServiceNotFoundError",
    "ServiceRegistry",
    "ServiceTimeoutError",
    "ServiceUnavailableError",
    "ShellFileError",
    "ShellResult",
    "ShellService",
    "StepMetrics",
    "Tool",
    "ToolArgumentError",
    "ToolBusyError",
    "ToolCall",
    "ToolDefinitionError",
    "ToolEnv",
    "ToolError",
    "ToolExecutionError",
    "ToolNotFoundError",
    "ToolParser",
    "ToolRegistry",
    "ToolService",
    "ToolServicesError",
    "ToolTimeoutError",
    "UserError",
    "XMLBlockParser",
    "__version__",
    "as_parser",
    "available_parsers",
    "get_parser",
    "get_services",
    "isolation_report",
    "python_tool",
    "render_tool_results",
    "shell_tools",
    "tool",
    "to_openai_messages",
]
