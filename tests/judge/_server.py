"""The judge's server for tests: ``serve --sandbox-fusion`` as a process, or the app in a
thread of this process (uvicorn on a free loopback port), and a small HTTP client."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

SRC = str(Path(__file__).resolve().parents[2] / "src")
READY = "toolservices judge ready: "


@contextlib.contextmanager
def judge_server(*args: str, python: str = sys.executable) -> Iterator[str]:
    """The server's base URL while it runs; stopped (SIGTERM, then SIGKILL) afterwards."""
    env = {**os.environ, "PYTHONPATH": SRC + os.pathsep + os.environ.get("PYTHONPATH", "")}
    proc = subprocess.Popen(
        [python, "-m", "toolservices", "serve", "--sandbox-fusion", "--port", "0", *args],
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        start_new_session=True,
    )
    try:
        assert proc.stderr is not None
        lines = []
        for line in proc.stderr:  # blocks until the ready line, or EOF if it died
            lines.append(line)
            if line.startswith(READY):
                break
        else:
            raise RuntimeError("the judge server did not start:\n" + "".join(lines))
        yield line[len(READY) :].strip()
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        if proc.stderr is not None:
            proc.stderr.close()


def call(base: str, path: str, body: Any = None, raw: bytes | None = None) -> tuple[int, Any]:
    data = raw if raw is not None else (None if body is None else json.dumps(body).encode())
    req = urllib.request.Request(base + path, data=data, method="GET" if data is None else "POST")
    try:
        with urllib.request.urlopen(req, timeout=60) as resp:
            text = resp.read().decode()
            status = resp.status
            kind = resp.headers.get("content-type", "")
    except urllib.error.HTTPError as err:
        text, status, kind = err.read().decode(), err.code, err.headers.get("content-type", "")
    return status, json.loads(text) if "json" in kind else text


@contextlib.contextmanager
def app_server(judge: Any, **options: Any) -> Iterator[str]:
    """The judge's app served by uvicorn on a free loopback port, in a thread."""
    import uvicorn

    from toolservices.judge._server import ReadyServer, build_app

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    config = uvicorn.Config(
        build_app(judge, **options), loop="asyncio", log_level="warning", lifespan="off"
    )
    ready = threading.Event()
    server = ReadyServer(config, ready.set)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        assert ready.wait(30), "the judge's server did not start"
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(30)
        sock.close()
