"""Messages that are not JSON, or not JSON-RPC, get a short JSON-RPC error on both transports."""

from __future__ import annotations

import importlib.metadata
import json
import queue
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx2
import pytest
from tests.mcp._serve_util import INITIALIZE, POST_HEADERS, WAIT
from tests.mcp.conftest import SERVE_TOOLS

#: (what the client sends, the JSON-RPC error code, the id of the answer, words of the message)
BAD = [
    (b"this is not json", -32700, None, "Parse error"),
    (b'{"jsonrpc": "2.0", "method": ', -32700, None, "Parse error"),
    (b'{"hello": "world"}', -32600, None, "'jsonrpc' must be"),
    (b"[1, 2]", -32600, None, "batches are not supported"),
    (b"42", -32600, None, "not a number"),
    (b'{"jsonrpc": "2.0", "id": 7}', -32600, 7, "no 'method'"),
    (b'{"jsonrpc": "2.0", "id": "x", "method": 3}', -32600, "x", "'method' must be a string"),
    (b'{"jsonrpc": "2.0", "id": 8, "method": "ping", "params": [1]}', -32600, 8, "'params'"),
    (b'{"jsonrpc": "2.0", "id": true, "method": "ping"}', -32600, None, "'id' must be"),
]


def _check(answer: dict[str, Any], code: int, ident: object, words: str) -> None:
    assert answer["jsonrpc"] == "2.0"
    assert answer["id"] == ident
    assert answer["error"]["code"] == code
    assert words in answer["error"]["message"]
    assert len(answer["error"]["message"]) < 200  # a sentence, not a validation report


class _StdioPeer:
    """A server process spoken to line by line; its answers arrive through a reader thread."""

    def __init__(self, argv: list[str]) -> None:
        self.proc = subprocess.Popen(
            argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL
        )
        self.lines: queue.Queue[bytes] = queue.Queue()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line)
        self.lines.put(b"")

    def send(self, data: bytes) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(data + b"\n")
        self.proc.stdin.flush()

    def answer(self) -> dict[str, Any]:
        line = self.lines.get(timeout=WAIT)
        assert line, "the server closed stdout"
        return dict(json.loads(line))

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        try:
            self.proc.wait(WAIT)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(WAIT)
        self._reader.join(WAIT)
        if self.proc.stdout is not None:
            self.proc.stdout.close()


@pytest.fixture
def stdio_peer() -> Iterator[_StdioPeer]:
    peer = _StdioPeer([sys.executable, SERVE_TOOLS])
    try:
        yield peer
    finally:
        peer.close()


def test_stdio_answers_every_bad_line_and_keeps_serving(stdio_peer: _StdioPeer) -> None:
    for data, code, ident, words in BAD:
        stdio_peer.send(data)
        _check(stdio_peer.answer(), code, ident, words)
    stdio_peer.send(b"")  # a blank line is no message: no answer, no harm
    stdio_peer.send(json.dumps(INITIALIZE).encode())
    initialized = stdio_peer.answer()
    assert initialized["id"] == 1
    assert initialized["result"]["serverInfo"] == {
        "name": "toolservices",
        "version": importlib.metadata.version("toolservices"),
    }


@pytest.fixture
def http_url(announced_server: Callable[..., tuple[subprocess.Popen[str], str]]) -> str:
    return announced_server([sys.executable, SERVE_TOOLS, "http"])[1]


@pytest.mark.parametrize(("data", "code", "ident", "words"), BAD)
def test_http_answers_a_bad_body_with_a_short_error(
    http_url: str, data: bytes, code: int, ident: object, words: str
) -> None:
    answer = httpx2.post(http_url, content=data, headers=POST_HEADERS, timeout=WAIT)
    assert answer.status_code == 400
    _check(answer.json(), code, ident, words)


def test_http_a_good_message_still_reaches_the_server(http_url: str) -> None:
    answer = httpx2.post(http_url, json=INITIALIZE, headers=POST_HEADERS, timeout=WAIT)
    assert answer.status_code == 200
    assert "toolservices" in answer.text


def test_stdio_from_a_regular_file_answers_bad_lines_too(tmp_path: Any) -> None:
    # A regular file cannot be polled, so the SDK's own reader runs: its failures are answered.
    script = tmp_path / "input.jsonl"
    script.write_bytes(b"not json\n" + b'{"hello": 1}\n' + json.dumps(INITIALIZE).encode() + b"\n")
    with script.open("rb") as stdin:
        done = subprocess.run(
            [sys.executable, SERVE_TOOLS], stdin=stdin, capture_output=True, timeout=WAIT
        )
    answers = [json.loads(line) for line in done.stdout.splitlines()]
    # the rejections and the server's own answers are written by two tasks: any order
    errors = sorted(a["error"]["code"] for a in answers if "error" in a)
    assert errors == [-32700, -32600] and all(a["id"] is None for a in answers if "error" in a)
    [initialized] = [a for a in answers if "result" in a]
    assert initialized["id"] == 1 and "serverInfo" in initialized["result"]


def test_asking_for_a_shell_tool_without_shell_hints_at_the_flag() -> None:
    cli = str(Path(sys.executable).parent / "toolservices")
    peer = _StdioPeer([cli, "serve", "--mcp"])
    try:
        peer.send(json.dumps(INITIALIZE).encode())
        assert peer.answer()["id"] == 1
        call = {"jsonrpc": "2.0", "id": 2, "method": "tools/call"}
        peer.send(json.dumps({**call, "params": {"name": "bash", "arguments": {}}}).encode())
        message = peer.answer()["error"]["message"]
        assert message.startswith("Unknown tool: bash. Available tools: python_execute")
        assert message.endswith(
            "(the shell tools are served with `toolservices serve --mcp --shell`)"
        )
        peer.send(
            json.dumps({**call, "id": 3, "params": {"name": "nope", "arguments": {}}}).encode()
        )
        assert "--shell" not in peer.answer()["error"]["message"]
    finally:
        peer.close()
