"""``toolservices serve --mcp --shell``: the shell tools over MCP, end to end."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from toolservices.mcp import HttpServer, MCPToolset, StdioServer

pytest.importorskip("toolservices.shell")

CLI = str(Path(sys.executable).parent / "toolservices")
#: A source checkout run through PYTHONPATH: the stdio child (which gets an
#: allowlisted environment) must see the same code.
CHILD_ENV = {"PYTHONPATH": os.environ["PYTHONPATH"]} if "PYTHONPATH" in os.environ else {}
WAIT = 30.0
SHELL_TOOLS = {"bash", "read_file", "write_file", "str_replace", "shell_close_session"}


def _text(ts: MCPToolset, tool: str, args: dict[str, Any]) -> str:
    result = ts.call(f"sh.{tool}", args)
    return ("Error: " if result.is_error else "") + result.text


def _check_shell_tools(ts: MCPToolset) -> None:
    names = {name.split(".", 1)[1] for name in ts.names()}
    assert names == SHELL_TOOLS | {"python_execute", "python_close_session"}
    s1 = {"session_id": "s1"}
    assert _text(ts, "bash", {"command": "mkdir w && cd w && export V=7", **s1}) == "[no output]"
    assert _text(ts, "bash", {"command": 'echo "$V $(basename $PWD)"', **s1}) == "7 w\n"
    program = "print(1 - 2)\n"
    assert _text(ts, "write_file", {"path": "w/p.py", "content": program, **s1}).startswith(
        "Wrote 13 bytes"
    )
    edit = {"path": "w/p.py", "old_str": "1 - 2", "new_str": "1 + 2", **s1}
    assert _text(ts, "str_replace", edit).startswith("Edited w/p.py")
    assert _text(ts, "bash", {"command": "python3 p.py", **s1}) == "3\n"
    assert _text(ts, "read_file", {"path": "w/p.py", **s1}) == "     1\tprint(1 + 2)"
    again = _text(ts, "str_replace", edit)
    assert "not found in w/p.py" in again and again.startswith("Error")
    # without a session: a fresh shell, closed after the call
    assert "No such file" in _text(ts, "bash", {"command": "cat w/p.py"})
    assert _text(ts, "shell_close_session", s1) == "Session s1 closed"
    assert "No such file" in _text(ts, "bash", {"command": "cat w/p.py", **s1})
    assert "was not open" in _text(ts, "shell_close_session", {"session_id": "never"})


@pytest.mark.usefixtures("no_leftover_processes")
def test_serve_mcp_stdio_offers_the_shell_tools_with_sessions() -> None:
    server = StdioServer(command=CLI, args=("serve", "--mcp", "--shell"), env=CHILD_ENV)
    with MCPToolset({"sh": server}, timeout=WAIT, connect_timeout=WAIT) as ts:
        _check_shell_tools(ts)


@pytest.mark.usefixtures("no_leftover_processes")
def test_without_shell_only_python_is_served() -> None:
    server = StdioServer(command=CLI, args=("serve", "--mcp"), env=CHILD_ENV)
    with MCPToolset({"sh": server}, timeout=WAIT, connect_timeout=WAIT) as ts:
        assert set(ts.names()) == {"sh.python_execute", "sh.python_close_session"}


@pytest.fixture
def http_cli(announced_server: Callable[..., tuple[subprocess.Popen[str], str]]) -> Any:
    return announced_server(
        [CLI, "serve", "--mcp", "--shell", "--transport", "http", "--port", "0"], timeout=WAIT
    )


@pytest.mark.usefixtures("no_leftover_processes")
def test_http_connections_own_their_shell_sessions(
    http_cli: tuple[subprocess.Popen[str], str],
) -> None:
    """Two clients both saying session "a" get two shells; a client's sessions end
    with its connection, and SIGTERM stops the server cleanly."""
    proc, url = http_cli
    with (
        MCPToolset({"sh": HttpServer(url=url)}, timeout=WAIT) as one,
        MCPToolset({"sh": HttpServer(url=url)}, timeout=WAIT) as two,
    ):
        _text(one, "write_file", {"path": "mine.txt", "content": "one", "session_id": "a"})
        assert "No such file" in _text(two, "bash", {"command": "cat mine.txt", "session_id": "a"})
        assert _text(one, "bash", {"command": "cat mine.txt", "session_id": "a"}) == "one"
    with MCPToolset({"sh": HttpServer(url=url)}, timeout=WAIT) as ts:
        _check_shell_tools(ts)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(WAIT) == 0


@pytest.mark.usefixtures("no_leftover_processes")
def test_shell_tool_arguments_output_cap_timeouts_and_binary_files() -> None:
    args = ("serve", "--mcp", "--shell", "--max-output", "2048", "--timeout", "5")
    server = StdioServer(command=CLI, args=args, env=CHILD_ENV)
    with MCPToolset({"sh": server}, timeout=WAIT, connect_timeout=WAIT) as ts:
        for tool in ts.tools():
            for name, prop in tool.schema_in.get("properties", {}).items():
                assert prop.get("description"), (tool.name, name)  # every argument explained
        s1 = {"session_id": "b1"}
        flood = _text(ts, "bash", {"command": "seq 1 100000", **s1})
        assert flood.startswith("1\n2\n") and flood.endswith("100000\n") and "omitted" in flood
        assert len(flood) < 2200
        slow = _text(ts, "bash", {"command": "sleep 4; echo late", "timeout": 0.5, **s1})
        assert slow.startswith("Error") and "timed out" in slow
        # binary content as base64; read back, it is named, not shown
        data = {"path": "b.bin", "content": "AAECAwQ=", "encoding": "base64", **s1}
        assert _text(ts, "write_file", data) == "Wrote 5 bytes to b.bin"
        assert _text(ts, "bash", {"command": "od -An -tx1 b.bin", **s1}).split() == [
            "00", "01", "02", "03", "04"
        ]  # fmt: skip
        assert "binary file" in _text(ts, "read_file", {"path": "b.bin", **s1})
        bad = _text(ts, "write_file", {**data, "content": "not base64!"})
        assert bad.startswith("Error") and "not valid base64" in bad


@pytest.mark.usefixtures("no_leftover_processes")
def test_shell_python_runs_python_execute_in_the_shell_session() -> None:
    """``--shell-python``: one environment for python_execute and bash, per session_id."""
    args = ("serve", "--mcp", "--shell", "--shell-python")
    server = StdioServer(command=CLI, args=args, env=CHILD_ENV)
    with MCPToolset({"sh": server}, timeout=WAIT, connect_timeout=WAIT) as ts:
        assert {name.split(".", 1)[1] for name in ts.names()} == SHELL_TOOLS | {"python_execute"}
        s1 = {"session_id": "p1"}
        wrote = ts.call("sh.python_execute", {"code": "open('f.txt', 'w').write('py')", **s1})
        assert not wrote.is_error, wrote.text
        assert _text(ts, "bash", {"command": "cat f.txt; echo sh > g.txt", **s1}) == "py"
        ts.call("sh.python_execute", {"code": "x = 41", **s1})
        read = ts.call("sh.python_execute", {"code": "print(open('g.txt').read(), x + 1)", **s1})
        assert json.loads(read.text)["stdout"] == "sh\n 42\n", read.text
        # another session (and a call without one) has neither the file nor the variable
        other = ts.call("sh.python_execute", {"code": "import os; print(os.path.exists('f.txt'))"})
        assert json.loads(other.text)["stdout"] == "False\n", other.text
        assert _text(ts, "shell_close_session", s1) == "Session p1 closed"
        gone = ts.call("sh.python_execute", {"code": "print('x' in globals())", **s1})
        assert json.loads(gone.text)["stdout"] == "False\n", gone.text


def test_shell_python_needs_shell() -> None:
    done = subprocess.run(
        [CLI, "serve", "--mcp", "--shell-python"],
        capture_output=True,
        text=True,
        timeout=WAIT,
        env={**os.environ, **CHILD_ENV},
    )
    assert done.returncode == 2 and "--shell-python needs --shell" in done.stderr, done
