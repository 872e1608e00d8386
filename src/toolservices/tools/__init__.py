"""Tools: typed functions and service objects with schemas and validation."""

from toolservices.tools._function_schema import STATE_PARAMETER, FunctionSchema, function_schema
from toolservices.tools.base import FunctionTool, ServiceTool, Tool, ToolService, as_tool, tool
from toolservices.tools.registry import ToolRegistry

__all__ = [
    "STATE_PARAMETER",
    "FunctionSchema",
    "FunctionTool",
    "ServiceTool",
    "Tool",
    "ToolRegistry",
    "ToolService",
    "as_tool",
    "function_schema",
    "tool",
]
