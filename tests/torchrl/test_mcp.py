"""MCPToolTransform on real ChatEnvs with real stdio MCP servers."""

from __future__ import annotations

import gc
import sys
import weakref
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from toolservices.mcp import MCPToolset
from toolservices.torchrl import MCPToolTransform

SERVER = str(Path(__file__).parent / "servers" / "tools_server.py")
SERVERS = {
    "tools": {"command": sys.executable, "args": [SERVER]},
    "time": {
        "command": sys.executable,
        "args": ["-m", "mcp_server_time", "--local-timezone", "UTC"],
    },
}


@pytest.fixture(scope="module")
def transform() -> Iterator[MCPToolTransform]:
    t = MCPToolTransform(SERVERS, timeout=10.0)
    yield t
    t.close()


def test_calls_results_and_contract_texts(chat: Any, transform: MCPToolTransform) -> None:
    driver = chat(transform.clone(), 4)
    driver.step(
        [
            '<tool>tools.add\n{"a": 1, "b": 2}</tool>',
            '<tool>add\n{"a": 40, "b": 2}</tool>',  # no prefix: the first server
            '<tool>tools.fail\n{"message": "nope"}</tool><tool>other.x\n{}</tool>',
            '<tool>time.get_current_time\n{"timezone": "UTC"}</tool>',
        ]
    )
    assert driver.tool_texts(0) == ["Tool tools.add executed successfully:\n3"]
    assert driver.tool_texts(1) == ["Tool tools.add executed successfully:\n42"]
    failed, unknown = driver.tool_texts(2)
    assert failed.startswith("Tool tools.fail failed:\n") and "nope" in failed
    assert unknown.startswith("Tool other.x failed:\nTool other.x not found")
    assert '"timezone": "UTC"' in driver.tool_texts(3)[0]
    assert driver.roles(0)[-2:] == ["tool", "<none>"]
    assert driver.metric("failed_calls") == [0, 0, 2, 0]


def test_a_failed_call_shows_the_servers_own_error(chat: Any, transform: MCPToolTransform) -> None:
    """The model's arguments reach the server, which judges them (its enum, its types)."""
    driver = chat(transform.clone(), 3)
    driver.step(
        [
            '<tool>tools.calculator\n{"operation": "invalid", "a": 2, "b": 3}</tool>',
            '<tool>tools.add\n{"a": "x", "b": 1}</tool>',
            '<tool>tools.calculator\n{"operation": "add", "a": 2, "b": 3}</tool>',
        ]
    )
    assert driver.tool_texts(0) == [
        "Tool tools.calculator failed:\nTool execution failed: "
        "Error executing tool calculator: Unknown operation: invalid"
    ]
    bad_type = driver.tool_texts(1)[0]
    assert bad_type.startswith(
        "Tool tools.add failed:\nTool execution failed: Error executing tool add: "
    )
    assert "validation error" in bad_type
    assert driver.tool_texts(2) == ["Tool tools.calculator executed successfully:\n5.0"]


def test_validate_arguments_checks_the_input_schema_first(chat: Any) -> None:
    with MCPToolset({"tools": SERVERS["tools"]}) as shared:
        driver = chat(MCPToolTransform(toolset=shared, validate_arguments=True), 1)
        driver.step(['<tool>tools.calculator\n{"operation": "invalid", "a": 2, "b": 3}</tool>'])
        assert driver.tool_texts(0) == [
            "Tool tools.calculator failed:\nInvalid arguments for tool 'tools.calculator': "
            'argument \'operation\' must be one of ["add", "multiply"]'
        ]


def test_items_call_servers_concurrently(chat: Any, transform: MCPToolTransform) -> None:
    # Each call returns "met 4" only once all four items' calls are in the server at once.
    driver = chat(transform.clone(), 4)
    driver.step(['<tool>tools.meet\n{"group": "items", "n": 4}</tool>'] * 4)
    for i in range(4):
        assert driver.tool_texts(i) == ["Tool tools.meet executed successfully:\nmet 4"]


def test_close_shuts_owned_servers_but_not_a_shared_toolset(chat: Any) -> None:
    with MCPToolset({"tools": SERVERS["tools"]}) as shared:
        borrowed = MCPToolTransform(toolset=shared)
        borrowed.close()
        assert shared.call("tools.add", {"a": 2, "b": 2}).text == "4"
    owned = MCPToolTransform({"tools": SERVERS["tools"]})
    owned.close()
    assert owned.toolset.status()["tools"]["state"] != "ready"


def test_a_server_that_cannot_start_raises_at_construction() -> None:
    with pytest.raises(Exception, match="broken"):
        MCPToolTransform(
            {"broken": {"command": sys.executable, "args": ["-c", "raise SystemExit(3)"]}}
        )


def test_garbage_collected_transform_shuts_its_servers() -> None:
    transform = MCPToolTransform({"tools": SERVERS["tools"]})
    toolset = transform.toolset
    assert toolset.status()["tools"]["state"] == "ready"
    ref = weakref.ref(transform)
    del transform
    gc.collect()
    assert ref() is None
    assert toolset.status()["tools"]["state"] != "ready"
