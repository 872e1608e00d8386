"""Real MCP servers for the bridge tests: our SDK-written demo server and mcp-server-time."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest
from tests._extras import missing, skip_every_module

# The MCP SDK and its HTTP client come with the `mcp` extra (or the dev extra's
# mcp-server-time): without them every test here skips, and nothing needing them loads.
REASON = missing("mcp", "httpx2")
if REASON is not None:
    pytest_pycollect_makemodule = skip_every_module(REASON)
else:
    from tests.mcp._serve_util import CLI, descendants, kill_group, start_server

SERVERS = Path(__file__).parent / "servers"
DEMO = str(SERVERS / "demo_server.py")
SERVE_TOOLS = str(SERVERS / "serve_tools.py")
#: Bound on every wait for a child process to start or stop.
PROCESS_WAIT = 20.0


def _demo_stdio(**env: str) -> dict[str, object]:
    return {"command": sys.executable, "args": [DEMO], "env": env}


@pytest.fixture(scope="session")
def demo_stdio() -> Callable[..., dict[str, object]]:
    """Factory of the contract's dict form for the demo server over stdio (``**env``)."""
    return _demo_stdio


@pytest.fixture(scope="session")
def time_stdio() -> dict[str, object]:
    """mcp-server-time (from PyPI) over stdio."""
    return {"command": sys.executable, "args": ["-m", "mcp_server_time", "--local-timezone", "UTC"]}


def server_children() -> set[int]:
    """Live (non-zombie) descendants of this test process."""
    return descendants(os.getpid())


@pytest.fixture
def no_leftover_processes() -> Iterator[None]:
    """Fail if the test leaves a child process running."""
    before = server_children()
    yield
    gone, alive = psutil.wait_procs(
        [psutil.Process(p) for p in server_children() - before if psutil.pid_exists(p)],
        timeout=PROCESS_WAIT,
    )
    assert not alive, f"processes left behind: {[p.pid for p in alive]}"


@dataclass
class HttpServerProcess:
    """A demo server on streamable HTTP, in its own process group."""

    proc: subprocess.Popen[str]
    port: int

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/mcp"

    def kill(self) -> None:
        os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(PROCESS_WAIT)

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(PROCESS_WAIT)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(PROCESS_WAIT)
        if self.proc.stdout is not None:
            self.proc.stdout.close()


def start_http_demo(port: int = 0) -> HttpServerProcess:
    """Start the demo server over HTTP and wait (bounded) for its PORT line."""
    proc = subprocess.Popen(
        [sys.executable, DEMO, "--http", "--port", str(port)],
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    assert proc.stdout is not None
    try:
        line = _readline(proc.stdout, PROCESS_WAIT)
        return HttpServerProcess(proc, int(line.split()[1]))
    except BaseException:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(PROCESS_WAIT)
        proc.stdout.close()
        raise


def _readline(stream: object, timeout: float) -> str:
    """One line from a child's pipe, or fail after ``timeout`` seconds."""
    import selectors

    with selectors.DefaultSelector() as sel:
        sel.register(stream, selectors.EVENT_READ)  # type: ignore[arg-type]
        if not sel.select(timeout):
            raise TimeoutError(f"no output from the server within {timeout}s")
    line = stream.readline()  # type: ignore[attr-defined]
    if not line:
        raise RuntimeError("the server exited before reporting readiness")
    return str(line)


@pytest.fixture
def http_demo() -> Iterator[HttpServerProcess]:
    server = start_http_demo()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def http_demo_factory() -> Iterator[Callable[[int], HttpServerProcess]]:
    """Start demo HTTP servers (on a given port, 0 = free); all are stopped afterwards."""
    started: list[HttpServerProcess] = []

    def start(port: int = 0) -> HttpServerProcess:
        server = start_http_demo(port)
        started.append(server)
        return server

    try:
        yield start
    finally:
        for server in started:
            server.stop()


#: What a server started by :func:`announced_server` is (the process, its URL).
Announced = tuple[subprocess.Popen[str], str]


@pytest.fixture
def announced_server() -> Iterator[Callable[..., Announced]]:
    """Start servers that print ``... ready: URL`` on stderr; all are killed afterwards.

    ``start(argv, timeout=PROCESS_WAIT)`` waits (bounded) for that line and
    returns the process and the URL.
    """
    started: list[subprocess.Popen[str]] = []

    def start(argv: list[str], *, timeout: float = PROCESS_WAIT) -> Announced:
        proc = subprocess.Popen(argv, stderr=subprocess.PIPE, text=True, start_new_session=True)
        started.append(proc)
        line = _readline(proc.stderr, timeout)
        assert "ready: http://127.0.0.1:" in line, line
        return proc, line.split("ready: ")[1].strip()

    try:
        yield start
    finally:
        for proc in started:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(PROCESS_WAIT)
            if proc.stderr is not None:
                proc.stderr.close()


#: ``serve --mcp`` over HTTP on a free port, two interpreters at once (after the CLI's path).
SERVE_HTTP = ["serve", "--mcp", "--transport", "http", "--port", "0", "--pool-size", "2"]


@pytest.fixture
def serve() -> Iterator[Callable[..., tuple[int, str]]]:
    """Start an HTTP ``serve --mcp`` with extra options: ``serve(*args)`` -> (pid, url)."""
    started: list[subprocess.Popen[str]] = []

    def start(*args: str) -> tuple[int, str]:
        proc, url = start_server([CLI, *SERVE_HTTP, *args])
        started.append(proc)
        return proc.pid, url

    try:
        yield start
    finally:
        for proc in started:
            kill_group(proc)


@pytest.fixture(scope="module")
def announced_module_server() -> Iterator[Callable[[list[str]], str]]:
    """Like ``announced_server``, for one module's tests: ``start(argv)`` -> URL."""
    started: list[subprocess.Popen[str]] = []

    def start(argv: list[str]) -> str:
        proc, url = start_server(argv)
        started.append(proc)
        return url

    try:
        yield start
    finally:
        for proc in started:
            kill_group(proc)
