"""MCP bridge: MCP servers' tools as toolservices tools, and our tools as an MCP server.

Client side: :class:`MCPToolset` connects to servers over stdio
(:class:`StdioServer`) or streamable HTTP (:class:`HttpServer`) and exposes
their tools as :class:`~toolservices.tools.Tool` objects named
``"server.tool"``. Server side: :func:`serve` exposes a
:class:`~toolservices.tools.ToolRegistry` (for example the sandboxed Python
executor) as an MCP server.
"""

from toolservices.mcp._config import HttpServer, ServerConfig, StdioServer
from toolservices.mcp._connection import MCPAuthError, MCPConnectionError, ServerState
from toolservices.mcp._content import Audio, Image, Resource, ResourceLink
from toolservices.mcp._python_tools import PythonSessions, python_tools
from toolservices.mcp._result import ContentPart, MCPResult
from toolservices.mcp._serve_main import serve_main
from toolservices.mcp._server import (
    aserve,
    build_server,
    current_connection,
    current_namespace,
    serve,
)
from toolservices.mcp._toolset import MCPTool, MCPToolset

__all__ = [
    "Audio",
    "Image",
    "Resource",
    "ResourceLink",
    "ContentPart",
    "HttpServer",
    "MCPAuthError",
    "MCPConnectionError",
    "MCPResult",
    "MCPTool",
    "MCPToolset",
    "PythonSessions",
    "ServerConfig",
    "ServerState",
    "StdioServer",
    "aserve",
    "build_server",
    "current_connection",
    "current_namespace",
    "python_tools",
    "serve",
    "serve_main",
]
