"""The sandboxed Python executor as MCP-servable tools, and the ``serve --mcp`` entry point."""

from __future__ import annotations

import logging
import signal
import threading
from types import FrameType
from typing import Any

from toolservices.mcp._server import Transport, _announce, serve
from toolservices.tools import FunctionTool, Tool

__all__ = ["python_tools", "serve_main"]

logger = logging.getLogger(__name__)


def python_tools(executor: Any) -> list[Tool]:
    """``python_execute`` and ``python_close_session`` tools over a PythonExecutorService."""

    async def python_execute(code: str, session_id: str | None = None) -> dict[str, Any]:
        """Run Python code in a sandboxed interpreter; return success, stdout and stderr.

        Give the same session_id on later calls to keep variables and imports
        between them; without one, the code runs in a fresh interpreter.
        """
        result = await executor.aexecute(code, session_id=session_id)
        return dict(result)  # ExecResult is a JSON-ready Mapping

    async def python_close_session(session_id: str) -> str:
        """Close a Python session and free its interpreter (its variables are lost)."""
        await executor.aclose_session(session_id)
        return f"Session {session_id} closed"

    return [FunctionTool(python_execute), FunctionTool(python_close_session)]


def serve_main(
    *,
    transport: Transport = "stdio",
    host: str = "127.0.0.1",
    port: int = 8765,
    path: str = "/mcp",
    pool_size: int = 4,
    timeout: float = 10.0,
) -> int:
    """``toolservices serve --mcp``: the sandboxed Python executor as an MCP server.

    Blocks until the client disconnects (stdio) or SIGINT/SIGTERM (HTTP);
    the executor's interpreters are shut down on the way out.
    """
    from toolservices.python import PythonExecutorService

    executor = PythonExecutorService(pool_size=pool_size, timeout=timeout)
    # SIGTERM must unwind through the finally below: the interpreters live in
    # their own process groups and would outlive a default-handled SIGTERM.
    # (uvicorn re-raises the signal to this handler after its graceful stop.)
    previous = None
    if threading.current_thread() is threading.main_thread():
        previous = signal.signal(signal.SIGTERM, _exit_on_sigterm)
    try:
        serve(
            python_tools(executor),
            transport=transport,
            host=host,
            port=port,
            path=path,
            name="toolservices-python",
            on_ready=_announce,
        )
    except KeyboardInterrupt:
        logger.info("interrupted")
    finally:
        executor.close()
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
    return 0


def _exit_on_sigterm(signum: int, frame: FrameType | None) -> None:
    raise SystemExit(128 + signum)
