"""MCPToolset against real servers: our SDK demo server (stdio) and mcp-server-time."""

from __future__ import annotations

import asyncio
import base64
import http.server
import os
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx2
import psutil
import pytest
from tests.mcp._inflight import start_parked

from toolservices.dispatch import Dispatcher
from toolservices.errors import (
    ToolExecutionError,
    ToolNotFoundError,
    ToolTimeoutError,
    UserError,
)
from toolservices.mcp import HttpServer, MCPAuthError, MCPConnectionError, MCPToolset, StdioServer
from toolservices.parsing.base import ToolCall
from toolservices.tools import ToolRegistry

SECRET = "TOOLSERVICES_MCP_TEST_SECRET"
DEMO = str(Path(__file__).parent / "servers" / "demo_server.py")
SERVE_TOOLS = str(Path(__file__).parent / "servers" / "serve_tools.py")
PROCESS_WAIT = 20.0
DemoFactory = Callable[..., dict[str, object]]


@pytest.fixture(scope="module")
def toolset(demo_stdio: DemoFactory, time_stdio: dict[str, object]) -> Iterator[MCPToolset]:
    os.environ[SECRET] = "must-not-leak"
    try:
        servers = {"demo": demo_stdio(GIVEN="explicit"), "time": time_stdio}
        with MCPToolset(servers, timeout=10.0) as ts:
            yield ts
    finally:
        del os.environ[SECRET]


# --- discovery ------------------------------------------------------------------------


def test_tools_are_discovered_with_names_schemas_and_descriptions(toolset: MCPToolset) -> None:
    names = toolset.names()
    assert {"demo.add", "demo.sleep", "demo.fail", "demo.big"} <= set(names)
    assert {"time.get_current_time", "time.convert_time"} <= set(names)
    add = next(t for t in toolset.tools() if t.name == "demo.add")
    assert add.description == "Add two integers."
    assert add.schema_in["required"] == ["a", "b"]
    assert add.schema_in["properties"]["a"]["type"] == "integer"
    assert add.is_async


def test_tools_appear_in_openai_specs_of_a_registry(toolset: MCPToolset) -> None:
    registry = ToolRegistry()
    toolset.register_into(registry)
    specs = {s["function"]["name"]: s["function"] for s in registry.openai_specs()}
    assert specs["time.get_current_time"]["parameters"]["required"] == ["timezone"]
    assert "timezone" in specs["time.get_current_time"]["description"].lower()
    with pytest.raises(UserError, match="already registered"):
        toolset.register_into(registry)
    assert len(toolset.register_into(registry, replace=True)) == len(toolset.names())


# --- calls ---------------------------------------------------------------------------------


def test_text_structured_image_and_large_results(toolset: MCPToolset) -> None:
    assert toolset.call("demo.add", {"a": 2, "b": 3}).text == "5"
    structured = toolset.call("demo.add_structured", {"a": 2, "b": 3})
    assert structured.structured == {"total": 5}
    image = toolset.call("demo.image")
    assert [p.type for p in image.parts] == ["image"]
    assert image.images[0].mime_type == "image/png"
    assert base64.b64decode(image.images[0].data or "").startswith(b"\x89PNG")
    assert str(image) == "[image: image/png]"
    big = toolset.call("demo.big", {"n": 2_000_000})
    assert len(big.text) == 2_000_000


def test_time_server_calls(toolset: MCPToolset) -> None:
    now = toolset.call("time.get_current_time", {"timezone": "UTC"})
    assert not now.is_error
    assert now.structured is not None and now.structured["timezone"] == "UTC"
    converted = toolset.call(
        "time.convert_time",
        {"source_timezone": "UTC", "time": "12:00", "target_timezone": "Asia/Tokyo"},
    )
    assert converted.structured is not None
    assert converted.structured["target"]["datetime"].endswith("21:00:00+09:00")
    bad = toolset.call("time.get_current_time", {"timezone": "Mars/Olympus"})
    assert bad.is_error and "Invalid timezone" in bad.text


def test_tool_failure_is_an_error_result_and_a_tool_error(toolset: MCPToolset) -> None:
    result = toolset.call("demo.fail", {"message": "boom"})
    assert result.is_error and result.text.endswith("boom")
    fail = next(t for t in toolset.tools() if t.name == "demo.fail")
    with pytest.raises(ToolExecutionError, match="boom"):
        fail(message="boom")


@pytest.mark.parametrize(
    "name",
    [
        "demo.nope",  # MCPServer answers with an isError result
        "time.nope",  # mcp-server-time answers with JSON-RPC -32602
        "nosuchserver.add",
        "noprefix",
    ],
)
def test_unknown_tool_is_tool_not_found(toolset: MCPToolset, name: str) -> None:
    with pytest.raises(ToolNotFoundError, match=f"Unknown tool: {name}") as info:
        toolset.call(name, {})
    assert "Available tools:" in str(info.value)
    assert "demo.add" in str(info.value) or "time.convert_time" in str(info.value)


def test_call_timeout_then_session_still_works(toolset: MCPToolset) -> None:
    with pytest.raises(ToolTimeoutError, match=r"demo\.sleep"):
        toolset.call("demo.sleep", {"seconds": 30}, timeout=0.3)
    assert toolset.call("demo.add", {"a": 1, "b": 1}).text == "2"


async def test_fifty_concurrent_calls_share_one_session(toolset: MCPToolset) -> None:
    # Each call answers "met 50" only once all fifty are inside the one server
    # process at the same time: in turn (or a few at a time) they would not meet.
    results = await asyncio.gather(
        *(toolset.acall("demo.meet", {"group": "fifty", "n": 50}) for _ in range(50))
    )
    assert [r.text for r in results] == ["met 50"] * 50


async def test_cancelling_the_caller_cancels_the_call(toolset: MCPToolset) -> None:
    task = await start_parked(toolset)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(task, PROCESS_WAIT)
    assert (await toolset.acall("demo.add", {"a": 4, "b": 4})).text == "8"


def test_stdio_server_gets_only_explicit_env_and_allowlist(toolset: MCPToolset) -> None:
    assert toolset.call("demo.getenv", {"name": SECRET}).text == "<unset>"
    assert toolset.call("demo.getenv", {"name": "GIVEN"}).text == "explicit"
    assert toolset.call("demo.getenv", {"name": "PATH"}).text == os.environ["PATH"]


def test_dispatcher_runs_mcp_tools_like_local_ones(toolset: MCPToolset) -> None:
    registry = ToolRegistry()
    toolset.register_into(registry)
    dispatcher = Dispatcher(registry, timeout=10.0)
    [item] = dispatcher.run(
        [
            [
                ToolCall("demo.add", {"a": 20, "b": 22}),
                ToolCall("demo.fail", {"message": "nope"}),
                ToolCall("demo.add", {"a": "x"}),
                ToolCall("time.get_current_time", {"timezone": "UTC"}),
            ]
        ]
    )
    ok, failed, invalid, now = item.results
    assert ok.ok and ok.content == "42"
    assert not failed.ok and failed.error_kind == "tool_failed" and "nope" in (failed.error or "")
    assert not invalid.ok and invalid.error_kind == "invalid_arguments"
    assert now.ok and '"timezone": "UTC"' in now.content
    assert item.metrics.calls == 4 and item.metrics.failed_calls == 2


def test_dispatcher_timeout_applies_to_mcp_tools(toolset: MCPToolset) -> None:
    registry = ToolRegistry()
    toolset.register_into(registry)
    [item] = Dispatcher(registry, timeout=0.3).run([[ToolCall("demo.sleep", {"seconds": 30})]])
    [result] = item.results
    assert result.timed_out
    assert toolset.call("demo.add", {"a": 1, "b": 2}).text == "3"


# --- configuration and lifecycle ------------------------------------------------------


def test_typed_and_dict_configs_are_equivalent() -> None:
    ts = MCPToolset(
        {
            "a": {"command": "x", "args": ["1"], "env": {"K": "V"}},
            "b": {"url": "http://127.0.0.1:1/mcp", "headers": {"H": "v"}},
            "c": StdioServer(command="y"),
        }
    )
    assert ts.servers["a"] == StdioServer(command="x", args=("1",), env={"K": "V"})
    assert ts.servers["b"] == HttpServer(url="http://127.0.0.1:1/mcp", headers={"H": "v"})


@pytest.mark.parametrize(
    ("servers", "kwargs", "message"),
    [
        ({}, {}, "non-empty"),
        ({"a.b": {"command": "x"}}, {}, "without '.'"),
        ({"a": {"command": "x", "url": "y"}}, {}, "either"),
        ({"a": {"command": "x", "argv": []}}, {}, "unknown config keys"),
        ({"a": {"args": []}}, {}, "needs 'command'"),
        ({"a": {"command": "x", "args": "-v"}}, {}, "list of strings"),
        ({"a": {"command": "x"}}, {"timeout": 0}, "'timeout' must be positive"),
    ],
)
def test_bad_configuration_is_a_user_error(
    servers: dict[str, object], kwargs: dict[str, float], message: str
) -> None:
    with pytest.raises(UserError, match=message):
        MCPToolset(servers, **kwargs)  # type: ignore[arg-type]


def test_lifecycle_nested_use_and_errors(demo_stdio: DemoFactory) -> None:
    ts = MCPToolset({"demo": demo_stdio()})
    with pytest.raises(UserError, match="not connected"):
        ts.call("demo.add", {"a": 1, "b": 2})
    with ts:
        with ts:  # shared by two users: only the outermost exit closes
            assert ts.connect() is ts
        assert ts.call("demo.add", {"a": 1, "b": 2}).text == "3"
    with pytest.raises(MCPConnectionError, match="closed"):
        ts.call("demo.add", {"a": 1, "b": 2})
    with pytest.raises(UserError, match="closed"):
        ts.connect()


@pytest.mark.usefixtures("no_leftover_processes")
@pytest.mark.parametrize(
    "config",
    [
        {"command": "/nonexistent/mcp-server"},
        {"command": sys.executable, "args": ["-c", "pass"]},
        {"url": "http://127.0.0.1:9/mcp"},  # nothing listens on the discard port
    ],
)
def test_failed_connect_raises_and_cleans_up(
    config: dict[str, object], demo_stdio: DemoFactory
) -> None:
    ts = MCPToolset({"demo": demo_stdio(), "broken": config}, connect_timeout=10.0)
    with pytest.raises(MCPConnectionError, match="connect to MCP server 'broken'") as info:
        ts.connect()
    assert not info.value.retryable


@pytest.mark.usefixtures("no_leftover_processes")
def test_connect_timeout_bounds_a_silent_server() -> None:
    silent = {"command": sys.executable, "args": ["-c", "import time; time.sleep(60)"]}
    ts = MCPToolset({"silent": silent}, connect_timeout=0.5)
    start = time.perf_counter()
    with pytest.raises(MCPConnectionError, match="TimeoutError"):
        ts.connect()
    assert time.perf_counter() - start < PROCESS_WAIT


@pytest.mark.usefixtures("no_leftover_processes")
def test_close_stops_every_server_process(
    demo_stdio: DemoFactory, time_stdio: dict[str, object]
) -> None:
    stubborn = demo_stdio(DEMO_LINGER="120")  # outlives stdin: needs the SIGTERM step
    with MCPToolset({"demo": stubborn, "time": time_stdio}) as ts:
        pid = int(ts.call("demo.pid").text)
        assert psutil.pid_exists(pid)
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    with pytest.raises(MCPConnectionError, match="closed"):
        ts.call("demo.add", {"a": 1, "b": 2})


async def test_async_context_manager(demo_stdio: DemoFactory) -> None:
    async with MCPToolset({"demo": demo_stdio()}) as ts:
        assert (await ts.acall("demo.add", {"a": 1, "b": 2})).text == "3"
        tool = next(t for t in ts.tools() if t.name == "demo.add")
        assert await tool.acall(a=3, b=4) == "7"


def test_interpreter_exit_without_close_stops_the_server() -> None:
    script = textwrap.dedent(
        f"""
        import sys
        from toolservices.mcp import MCPToolset
        server = {{"command": sys.executable, "args": [{DEMO!r}], "env": {{"DEMO_LINGER": "120"}}}}
        ts = MCPToolset({{"demo": server}})
        ts.connect()
        print(ts.call("demo.pid").text, flush=True)
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    pid = int(out.stdout.strip())
    # The server ignores its stdin closing; only the child's exit-time safety
    # net (SIGTERM to the server's process group) can have stopped it.
    assert not psutil.pid_exists(pid)


async def test_close_fails_calls_in_flight_as_not_retryable(demo_stdio: DemoFactory) -> None:
    ts = await MCPToolset({"demo": demo_stdio()}).aconnect()
    task = await start_parked(ts)
    await ts.aclose()
    with pytest.raises(MCPConnectionError, match="shut down during the call") as info:
        await asyncio.wait_for(task, PROCESS_WAIT)
    assert not info.value.retryable


# --- one background loop ------------------------------------------------------------------


def test_sessions_live_on_the_librarys_one_loop(toolset: MCPToolset) -> None:
    from toolservices import _portal

    names = {t.name for t in threading.enumerate()}
    # the library's loop thread, and no loop thread of the bridge's own (it was "toolservices-mcp")
    assert "toolservices-loop" in names and "toolservices-mcp" not in names

    async def on_the_shared_loop() -> tuple[bool, str]:
        # A coroutine run by the portal (as the dispatcher's sync entry points do)
        # awaits the call on its own loop: no hop, no thread.
        result = await toolset.acall("demo.add", {"a": 2, "b": 3})
        return _portal.on_loop_thread(), result.text

    assert _portal.run_sync(on_the_shared_loop) == (True, "5")


def test_a_blocking_call_from_the_shared_loop_says_to_await(toolset: MCPToolset) -> None:
    from toolservices import _portal

    async def blocking_inside() -> None:
        toolset.call("demo.add", {"a": 1, "b": 1})

    with pytest.raises(RuntimeError, match="await the async variant"):
        _portal.run_sync(blocking_inside)


def test_the_client_introduces_itself_as_toolservices(toolset: MCPToolset) -> None:
    import importlib.metadata

    version = importlib.metadata.version("toolservices")
    assert toolset.call("demo.client_info").text == f"toolservices {version}"


# --- HTTP refusals ------------------------------------------------------------------------


def test_a_401_keeps_its_status_and_challenge(serve: Callable[..., tuple[int, str]]) -> None:
    _, url = serve("--token", "t" * 20)
    wrong = HttpServer(url=url, headers={"Authorization": "Bearer " + "w" * 20})
    with pytest.raises(MCPAuthError) as refused:
        MCPToolset({"py": wrong}, connect_timeout=PROCESS_WAIT).connect()
    assert refused.value.status == 401
    assert refused.value.retryable is False
    assert refused.value.www_authenticate == 'Bearer realm="toolservices", error="invalid_token"'
    assert "HTTP 401 Unauthorized (WWW-Authenticate: Bearer realm=" in refused.value.message
    assert "not one this server accepts" in refused.value.message  # the server's own words


class _Refusing(http.server.BaseHTTPRequestHandler):
    """Answers everything with a bare 401 (no JSON-RPC body), as OAuth-protected servers do."""

    def do_POST(self) -> None:  # noqa: N802 (the http.server spelling)
        body = b"Unauthorized"
        self.send_response(401)
        self.send_header("WWW-Authenticate", 'Bearer resource_metadata="http://x/.well-known"')
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_DELETE = do_POST  # noqa: N815

    def log_message(self, *args: object) -> None:
        pass


def test_a_bare_401_is_not_just_an_error_response() -> None:
    with http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Refusing) as httpd:
        threading.Thread(target=httpd.serve_forever, daemon=True).start()
        try:
            url = f"http://127.0.0.1:{httpd.server_address[1]}/mcp"
            with pytest.raises(MCPAuthError) as refused:
                MCPToolset({"oauth": HttpServer(url=url)}, connect_timeout=PROCESS_WAIT).connect()
        finally:
            httpd.shutdown()
    assert refused.value.status == 401
    assert refused.value.www_authenticate == 'Bearer resource_metadata="http://x/.well-known"'
    assert refused.value.message.startswith(
        "Could not connect to MCP server 'oauth': HTTP 401 Unauthorized (WWW-Authenticate: Bearer"
    )


class _Gatekeeper(http.server.ThreadingHTTPServer):
    """A proxy to an MCP server that answers a bare 401 once ``refuse`` is set (a revoked token)."""

    def __init__(self, upstream: str) -> None:
        super().__init__(("127.0.0.1", 0), _Forwarding)
        self.upstream = upstream
        self.refuse = threading.Event()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}/mcp"


class _Forwarding(_Refusing):
    server: _Gatekeeper

    def do_POST(self) -> None:  # noqa: N802
        if self.server.refuse.is_set():
            super().do_POST()
            return
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        skip = {"host", "content-length", "connection", "transfer-encoding"}
        headers = {k: v for k, v in self.headers.items() if k.lower() not in skip}
        answer = httpx2.request(
            self.command, self.server.upstream, content=body, headers=headers, timeout=PROCESS_WAIT
        )
        self.send_response(answer.status_code)
        for key, value in answer.headers.items():
            if key.lower() not in skip | {"content-encoding"}:
                self.send_header(key, value)
        self.send_header("Content-Length", str(len(answer.content)))
        self.end_headers()
        self.wfile.write(answer.content)

    do_DELETE = do_POST  # noqa: N815

    def do_GET(self) -> None:  # noqa: N802 (no standalone event stream through this proxy)
        self.send_response(405)
        self.send_header("Content-Length", "0")
        self.end_headers()


def test_a_401_during_a_session_keeps_its_status_and_challenge(
    announced_server: Callable[..., tuple[subprocess.Popen[str], str]],
) -> None:
    _, upstream = announced_server([sys.executable, SERVE_TOOLS, "http"])
    with _Gatekeeper(upstream) as gate:
        threading.Thread(target=gate.serve_forever, daemon=True).start()
        try:
            with MCPToolset({"p": HttpServer(url=gate.url)}, timeout=PROCESS_WAIT) as ts:
                assert ts.call("p.multiply", {"a": 6, "b": 7}).text == "42"
                gate.refuse.set()
                with pytest.raises(MCPAuthError) as refused:
                    ts.call("p.multiply", {"a": 6, "b": 7})
        finally:
            gate.shutdown()
    assert refused.value.status == 401 and refused.value.retryable is False
    assert refused.value.www_authenticate == 'Bearer resource_metadata="http://x/.well-known"'
    assert refused.value.message.startswith(
        "MCP server 'p' refused 'p.multiply': HTTP 401 Unauthorized (WWW-Authenticate: Bearer"
    )
