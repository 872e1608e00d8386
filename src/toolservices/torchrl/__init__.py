"""TorchRL integration: drop-in tool transforms for ``ChatEnv`` (history mode).

Migrating from TorchRL 0.14.1 is one import line::

    from torchrl.envs.llm.transforms import X   ->   from toolservices.torchrl import X

Every tool transform writes per-item metrics under the ``"tool_metrics"``
key (:data:`METRICS_KEY`): ``calls``, ``failed_calls``, ``parse_errors``,
``timeouts``, ``tool_time``, ``failed_turns`` and ``end_reason``.
This is the only module of the library that imports torch.
"""

from __future__ import annotations

from toolservices._lazy import lazy_attributes
from toolservices.parsing import JSONCallParser, XMLBlockParser
from toolservices.parsing.base import LLMToolParser, ParseResult, ToolCall
from toolservices.tools import ToolRegistry, ToolService
from toolservices.torchrl._base import END_REASON_FAILURES, METRICS_KEY, ToolTransformBase
from toolservices.torchrl._history import ToolMessage, history_to_messages
from toolservices.torchrl.execute import ExecuteToolsInOrder, SimpleToolTransform

# Loaded on first use: they pull in the executor and the MCP client.
_LAZY = {
    "PythonInterpreter": "toolservices.torchrl.python",
    "MCPToolTransform": "toolservices.torchrl.mcp",
    "PythonExecutorService": "toolservices.python",
    "PersistentPythonProcess": "toolservices.python",
}


__getattr__ = lazy_attributes(__name__, _LAZY)


__all__ = [
    "END_REASON_FAILURES",
    "METRICS_KEY",
    "ExecuteToolsInOrder",
    "JSONCallParser",
    "LLMToolParser",
    "MCPToolTransform",
    "ParseResult",
    "PersistentPythonProcess",
    "PythonExecutorService",
    "PythonInterpreter",
    "SimpleToolTransform",
    "ToolCall",
    "ToolMessage",
    "ToolRegistry",
    "ToolService",
    "ToolTransformBase",
    "XMLBlockParser",
    "history_to_messages",
]
