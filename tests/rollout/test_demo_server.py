"""``toolservices demo --server URL --model NAME`` run as a user would, on the loopback server."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

from toolservices.cli._demo_data import FORMAT_TURNS, SCENARIOS
from toolservices.parsing import get_parser
from toolservices.rollout.testing import Fail, ScriptedChatServer


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "toolservices", "demo", *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def hermes_script() -> dict[str, list[Any]]:
    return {
        s.prompt: list(turns) for s, turns in zip(SCENARIOS, FORMAT_TURNS["hermes"], strict=True)
    }


def server_parsed(turn: str) -> str | dict[str, Any]:
    """What a vLLM server with the hermes tool parser returns for ``turn``."""
    parsed = get_parser("hermes")(turn)
    if not parsed.calls or parsed.errors:
        return turn  # unparseable calls stay in the text
    calls = [
        {
            "id": f"call_{i}",
            "type": "function",
            "function": {"name": call.tool, "arguments": json.dumps(call.args)},
        }
        for i, call in enumerate(parsed.calls)
    ]
    return {"content": parsed.text, "tool_calls": calls}


def summary(out: str) -> str:
    return next(line for line in out.splitlines() if line.startswith("episodes: "))


def test_demo_against_a_server_parsing_text_here() -> None:
    with ScriptedChatServer(hermes_script()) as server:
        proc = run_cli("--server", server.url, "--model", "scripted", "--parser", "hermes")
        requests = list(server.requests)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "all episodes played against the server" in proc.stdout
    assert proc.stdout.count(" answered") == 4
    # 4 scenarios: 2 turns each, the recovering one 3; one malformed first call.
    assert "episodes: 4  calls: 5  failed calls: 0  parse errors: 1  requests: 9" in summary(
        proc.stdout
    )
    assert len(requests) == 9 and all(r["model"] == "scripted" and r["tools"] for r in requests)
    assert requests[0]["messages"][0]["role"] == "system"


def test_demo_against_a_server_that_parses_tool_calls() -> None:
    script = {
        prompt: [server_parsed(t) for t in turns] for prompt, turns in hermes_script().items()
    }
    with ScriptedChatServer(script) as server:
        proc = run_cli("--server", server.url, "--model", "scripted", "--repeats", "2")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "parser: server tool_calls" in proc.stdout
    # The malformed call stays text on the server's side: that episode answers at once.
    assert summary(proc.stdout).startswith(
        "episodes: 8  calls: 8  failed calls: 0  parse errors: 0"
    )


def test_demo_reports_episodes_the_server_refused() -> None:
    script = hermes_script()
    first = SCENARIOS[0].prompt
    script[first] = [Fail(status=400, times=None, message="model not loaded")]
    with ScriptedChatServer(script) as server:
        proc = run_cli("--server", server.url, "--model", "scripted", "--parser", "hermes")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "request_error: HTTP 400: model not loaded" in proc.stdout
    assert "1 episode(s) could not be played" in proc.stdout


def test_demo_server_options_are_checked() -> None:
    no_model = run_cli("--server", "http://127.0.0.1:9/v1")
    assert no_model.returncode == 2 and "--server needs --model" in no_model.stderr
    no_server = run_cli("--model", "m")
    assert no_server.returncode == 2 and "need --server" in no_server.stderr
    bad_parser = run_cli("--server", "http://127.0.0.1:9/v1", "--model", "m", "--parser", "nope")
    assert bad_parser.returncode == 2 and "nope" in bad_parser.stderr
    assert "Traceback" not in bad_parser.stderr
