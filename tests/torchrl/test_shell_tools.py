"""The shell tools in TorchRL's ExecuteToolsInOrder: one shell session per batch item."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from toolservices import shell_tools
from toolservices.torchrl import ExecuteToolsInOrder, ToolRegistry

shell_module = pytest.importorskip("toolservices.shell")


@pytest.fixture(scope="module")
def shell() -> Iterator[Any]:
    with shell_module.ShellService(pool_size=2, timeout=10.0) as svc:
        yield svc


def test_each_batch_item_has_its_own_shell_until_reset(chat: Any, shell: Any) -> None:
    before = shell.stats()["sessions"]
    driver = chat(ExecuteToolsInOrder(ToolRegistry(shell_tools(shell)), "xml_block"), 2)
    driver.step(
        [
            '<tool name="bash">{"command": "cd /tmp && echo one > mine"}</tool>',
            '<tool name="write_file">{"path": "mine", "content": "two"}</tool>',
        ]
    )
    assert "succeeded" in driver.tool_texts(0)[0] and "Wrote 3 bytes" in driver.tool_texts(1)[0]
    driver.step(['<tool name="bash">{"command": "cat mine"}</tool>'] * 2)
    assert "one" in driver.tool_texts(0)[0]  # the shell stayed in /tmp
    assert "two" in driver.tool_texts(1)[0] and "one" not in driver.tool_texts(1)[0]
    assert shell.stats()["sessions"] == before + 2
    driver.reset()
    driver.step(['<tool name="bash">{"command": "cat /tmp/mine"}</tool>', "done"])
    assert "No such file" in driver.tool_texts(0)[0]  # a reset item: a new session
    assert shell.stats()["sessions"] == before + 1  # the reset closed the two old ones


def test_setup_seeds_and_finalize_scores_each_item(chat: Any, shell: Any) -> None:
    def setup(episode: Any) -> None:
        index = episode.context["batch_index"]
        shell.write_file("seed.txt", f"item {index}\n", session_id=episode.shell_session)

    async def finalize(episode: Any) -> str:
        return (await shell.aread_file("seed.txt", session_id=episode.shell_session)).strip()

    transform = ExecuteToolsInOrder(
        ToolRegistry(shell_tools(shell)), "xml_block", setup=setup, finalize=finalize
    )
    driver = chat(transform, 2)
    driver.step(
        [
            '<tool name="bash">{"command": "cat seed.txt; echo more >> seed.txt"}</tool>',
            '<tool name="bash">{"command": "cat seed.txt"}</tool>',
        ]
    )
    assert "item 0" in driver.tool_texts(0)[0] and "item 1" in driver.tool_texts(1)[0]
    assert transform.finalize_items() == ["item 0\nmore", "item 1"]
    driver.reset()  # the old episodes end (finalize ran already: not again)
    assert transform.outcomes == ["item 0\nmore", "item 1"] and transform.errors == [None, None]


def test_python_on_the_shell_shares_each_items_session(chat: Any, shell: Any) -> None:
    """python_tool(shell=...) beside the shell tools: per item, one environment for both."""
    from toolservices import python_tool

    tools = ToolRegistry([python_tool(shell=shell), *shell_tools(shell)])
    driver = chat(ExecuteToolsInOrder(tools, "xml_block"), 2)
    driver.step(
        [
            "<tool name=\"python\">{\"code\": \"open('p.txt', 'w').write('py 0')\"}</tool>",
            "<tool name=\"python\">{\"code\": \"open('p.txt', 'w').write('py 1')\"}</tool>",
        ]
    )
    driver.step(['<tool name="bash">{"command": "cat p.txt"}</tool>'] * 2)
    assert "py 0" in driver.tool_texts(0)[0] and "py 1" in driver.tool_texts(1)[0]
    driver.reset()
