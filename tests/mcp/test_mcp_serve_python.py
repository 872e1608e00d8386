"""``toolservices serve --mcp``: the sandboxed Python executor as an MCP server, end to end."""

from __future__ import annotations

import importlib.metadata
import os
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from toolservices.mcp import HttpServer, MCPToolset, StdioServer

CLI = str(Path(sys.executable).parent / "toolservices")
WAIT = 30.0


def _check_python_tools(ts: MCPToolset) -> None:
    version = importlib.metadata.version("toolservices")
    assert ts.status()["py"]["server"] == {"name": "toolservices", "version": version}
    assert set(ts.names()) == {"py.python_execute", "py.python_close_session"}
    run = "py.python_execute"
    first = ts.call(run, {"code": "x = 21\nprint(x * 2)", "session_id": "s1"}).structured
    assert first is not None and first["success"] and first["stdout"] == "42\n"
    again = ts.call(run, {"code": "print(x)", "session_id": "s1"}).structured
    assert again is not None and again["stdout"] == "21\n"
    fresh = ts.call(run, {"code": "print(x)"}).structured
    assert fresh is not None and not fresh["success"] and "NameError" in fresh["stderr"]
    failing = ts.call(run, {"code": "raise ValueError('Test error')"}).structured
    assert failing is not None and "ValueError: Test error" in failing["stderr"]
    closed = ts.call("py.python_close_session", {"session_id": "s1"})
    assert not closed.is_error
    after = ts.call(run, {"code": "print(x)", "session_id": "s1"}).structured
    assert after is not None and not after["success"]


@pytest.mark.usefixtures("no_leftover_processes")
def test_serve_mcp_stdio_runs_python_with_sessions() -> None:
    # PYTHONPATH passes through so a source checkout's server is the one tested.
    env = {k: v for k, v in os.environ.items() if k == "PYTHONPATH"}
    server = StdioServer(command=CLI, args=("serve", "--mcp"), env=env)
    with MCPToolset({"py": server}, timeout=WAIT, connect_timeout=WAIT) as ts:
        _check_python_tools(ts)


@pytest.fixture
def http_cli(announced_server: Callable[..., tuple[subprocess.Popen[str], str]]) -> Any:
    return announced_server(
        [CLI, "serve", "--mcp", "--transport", "http", "--port", "0"], timeout=WAIT
    )


@pytest.mark.usefixtures("no_leftover_processes")
def test_serve_mcp_http_runs_python_and_stops_cleanly_on_sigterm(
    http_cli: tuple[subprocess.Popen[str], str],
) -> None:
    proc, url = http_cli
    with MCPToolset({"py": HttpServer(url=url)}, timeout=WAIT) as ts:
        _check_python_tools(ts)
    proc.send_signal(signal.SIGTERM)
    # 0: SIGTERM drains the server and unwinds through serve_main (closing the
    # executor) instead of killing the process (-15), which would strand interpreters.
    assert proc.wait(WAIT) == 0
