"""The official MCP conformance suite's server scenarios, against our server.

Scenarios of features this library offers must pass with no failed check:
against ``tests/mcp/servers/conformance_server.py`` (the tools the scenarios
call, written as toolservices tools and served by :func:`toolservices.mcp.serve`)
and against ``toolservices serve --mcp`` itself. The suite (and Node >= 22)
is installed from npm on first use (see ``tests/mcp/_conformance.py``); where
it cannot be, these tests skip and say why.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from tests.mcp._conformance import Suite, Unavailable, install
from tests.mcp._serve_util import CLI

SERVERS = Path(__file__).parent / "servers"
#: Bound on one scenario (each makes a handful of requests).
SCENARIO_TIMEOUT = 120.0

#: Scenarios of what our serving layer offers (tools, content, SSE, host checks). The rest
#: need resources, prompts, completion, logging, progress, sampling or elicitation.
TOOL_SCENARIOS = [
    "server-initialize",
    "ping",
    "tools-list",
    "tools-call-simple-text",
    "tools-call-image",
    "tools-call-audio",
    "tools-call-embedded-resource",
    "tools-call-mixed-content",
    "tools-call-error",
    "json-schema-2020-12",
    "server-sse-multiple-streams",
    "dns-rebinding-protection",
]
#: The scenarios that need no particular tool, for ``serve --mcp`` itself.
PROTOCOL_SCENARIOS = [
    "server-initialize",
    "ping",
    "tools-list",
    "server-sse-multiple-streams",
    "dns-rebinding-protection",
]


@pytest.fixture(scope="module")
def suite() -> Suite:
    try:
        return install()
    except Unavailable as reason:
        pytest.skip(f"MCP conformance suite unavailable: {reason}")


def _run(suite: Suite, url: str, scenario: str, out: Path) -> list[dict[str, Any]]:
    """Run one scenario; its checks as the suite wrote them."""
    argv = suite.argv("server", "--url", url, "--scenario", scenario, "-o", str(out))
    done = subprocess.run(argv, capture_output=True, text=True, timeout=SCENARIO_TIMEOUT)
    found = list(out.glob(f"server-{scenario}-*/checks.json"))
    assert found, f"no results for {scenario}:\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}"
    return list(json.loads(found[0].read_text()))


def _failures(checks: list[dict[str, Any]]) -> list[str]:
    return [f"{c['id']}: {c.get('errorMessage', '')}" for c in checks if c["status"] == "FAILURE"]


@pytest.fixture(scope="module")
def tools_url(announced_module_server: Callable[[list[str]], str]) -> str:
    return announced_module_server([sys.executable, str(SERVERS / "conformance_server.py")])


@pytest.fixture(scope="module")
def serve_mcp_url(announced_module_server: Callable[[list[str]], str]) -> str:
    return announced_module_server([CLI, "serve", "--mcp", "--transport", "http", "--port", "0"])


@pytest.mark.parametrize("scenario", TOOL_SCENARIOS)
def test_tool_scenarios(suite: Suite, tools_url: str, scenario: str, tmp_path: Path) -> None:
    checks = _run(suite, tools_url, scenario, tmp_path)
    assert checks and not _failures(checks)


@pytest.mark.parametrize("scenario", PROTOCOL_SCENARIOS)
def test_serve_mcp_protocol_scenarios(
    suite: Suite, serve_mcp_url: str, scenario: str, tmp_path: Path
) -> None:
    checks = _run(suite, serve_mcp_url, scenario, tmp_path)
    assert checks and not _failures(checks)
