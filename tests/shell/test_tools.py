"""The shell tools models are trained on, in real sandboxed shell sessions.

``bash``, ``read_file``, ``write_file`` and ``str_replace`` run in the calling
episode's own session: one per episode, forked with it, closed with it.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

import pytest

from toolservices import Episode, ToolEnv, shell_tools
from toolservices.env import SHELL_TOOL_NAMES, bash_tool, read_file_tool, str_replace_tool
from toolservices.errors import UserError
from toolservices.shell import ShellService


def call(name: str, **args: Any) -> dict[str, Any]:
    """An assistant message making one server-parsed call."""
    return {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {
                "id": f"call_{uuid.uuid4().hex[:8]}",
                "type": "function",
                "function": {"name": name, "arguments": json.dumps(args)},
            }
        ],
    }


async def step(episode: Episode, name: str, **args: Any) -> str:
    (reply,) = await episode.astep(call(name, **args))
    return str(reply["content"])


def episode(shell: ShellService, **kwargs: Any) -> Episode:
    return Episode(shell_tools(shell), parser=None, max_turns=None, end_on_answer=False, **kwargs)


def test_each_tool_has_a_json_schema(shell: ShellService) -> None:
    specs = {t.name: t.openai_spec()["function"] for t in shell_tools(shell)}
    assert list(specs) == ["bash", "read_file", "write_file", "str_replace"]
    assert tuple(specs) == SHELL_TOOL_NAMES  # the list the adapters and the MCP server use
    required = {name: spec["parameters"]["required"] for name, spec in specs.items()}
    assert required == {
        "bash": ["command"],
        "read_file": ["path"],
        "write_file": ["path", "content"],
        "str_replace": ["path", "old_str", "new_str"],
    }
    assert set(specs["read_file"]["parameters"]["properties"]) == {"path", "start_line", "end_line"}
    assert all(spec["description"] for spec in specs.values())
    assert read_file_tool(shell, name="view").name == "view"


async def test_write_run_fix_and_test_in_one_episode(shell: ShellService) -> None:
    async with episode(shell) as ep:
        assert ep.shell is shell and ep.shell_session is not None
        program = "def add(a, b):\n    return a - b\n\nprint(add(2, 3))\n"
        assert await step(ep, "write_file", path="calc.py", content=program) == (
            f"Wrote {len(program)} bytes (4 lines) to calc.py"
        )
        assert await step(ep, "bash", command="python3 calc.py") == "-1\n"
        edited = await step(ep, "str_replace", path="calc.py", old_str="a - b", new_str="a + b")
        assert edited.startswith("Edited calc.py; lines 1-4 now read:\n")
        assert "     2\t    return a + b" in edited
        assert await step(ep, "bash", command="python3 calc.py") == "5\n"
        shown = await step(ep, "read_file", path="calc.py", start_line=2, end_line=2)
        assert (
            shown
            == "     2\t    return a + b\n[lines 2-2 of 4; use start_line/end_line for others]"
        )
        assert ep.metrics.failed_calls == 0


async def test_the_shell_keeps_its_state_between_calls(shell: ShellService) -> None:
    async with episode(shell) as ep:
        await step(ep, "bash", command="mkdir -p work && cd work && export WHO=model")
        assert await step(ep, "bash", command='echo "$WHO in $(basename $PWD)"') == (
            "model in work\n"
        )
        # relative file paths are in the workspace, not the shell's current directory
        await step(ep, "write_file", path="work/note.txt", content="hi\n")
        assert await step(ep, "bash", command="cat note.txt") == "hi\n"


async def test_a_failing_command_is_information_not_a_failed_call(shell: ShellService) -> None:
    async with episode(shell) as ep:
        text = await step(ep, "bash", command="echo out; echo err >&2; exit 3")
        assert text == "out\n[stderr]\nerr\n[exit status 3]"
        assert await step(ep, "bash", command="true") == "[no output]"
        assert ep.metrics.failed_calls == 0


async def test_str_replace_refuses_zero_or_several_matches(shell: ShellService) -> None:
    async with episode(shell) as ep:
        await step(ep, "write_file", path="f.py", content="x = 1\ny = 1\nx = 1\n")
        missing = await step(ep, "str_replace", path="f.py", old_str="z = 1", new_str="z = 2")
        assert "not found in f.py; nothing was changed" in missing
        assert "whitespace and indentation" in missing
        several = await step(ep, "str_replace", path="f.py", old_str="x = 1", new_str="x = 2")
        assert "occurs 2 times in f.py (at lines 1, 3); nothing was changed" in several
        assert "more surrounding lines" in several
        empty = await step(ep, "str_replace", path="f.py", old_str="", new_str="x")
        assert "old_str is empty" in empty
        assert await step(ep, "bash", command="cat f.py") == "x = 1\ny = 1\nx = 1\n"
        unique = await step(ep, "str_replace", path="f.py", old_str="x = 1\ny", new_str="x = 3\ny")
        assert unique.startswith("Edited f.py")
        assert await step(ep, "bash", command="cat f.py") == "x = 3\ny = 1\nx = 1\n"
        assert ep.metrics.failed_calls == 3


async def test_read_file_numbers_lines_pages_and_lists_directories(shell: ShellService) -> None:
    async with episode(shell) as ep:
        await step(ep, "bash", command="mkdir d && touch d/a && seq 1 1000 > d/n.txt")
        first = await step(ep, "read_file", path="d/n.txt")
        lines = first.splitlines()
        assert lines[0] == "     1\t1" and lines[399] == "   400\t400"
        assert lines[-1] == "[lines 1-400 of 1000; use start_line/end_line for others]"
        tail = await step(ep, "read_file", path="d/n.txt", start_line=999)
        assert tail.splitlines() == [
            "   999\t999",
            "  1000\t1000",
            "[lines 999-1000 of 1000; use start_line/end_line for others]",
        ]
        assert "past the end" in await step(ep, "read_file", path="d/n.txt", start_line=2000)
        assert "before start_line" in await step(
            ep, "read_file", path="d/n.txt", start_line=5, end_line=2
        )
        assert await step(ep, "read_file", path="d") == "a\nn.txt"
        missing = await step(ep, "read_file", path="nope.txt")
        assert "nope.txt" in missing and missing.startswith("Error")
        bad = await step(ep, "read_file", path="d/n.txt", start_line=0)
        assert "start_line must be at least 1" in bad


async def test_episodes_have_their_own_sessions_closed_with_them(shell: ShellService) -> None:
    before = shell.stats()["sessions"]
    first, second = episode(shell), episode(shell)
    assert first.shell_session != second.shell_session
    await step(first, "write_file", path="secret.txt", content="mine")
    assert "No such file" in await step(second, "bash", command="cat secret.txt")
    assert shell.stats()["sessions"] == before + 2
    await first.aclose()
    await second.aclose()
    assert shell.stats()["sessions"] == before
    assert not await shell.aclose_session(first.shell_session or "")


async def test_fork_copies_files_and_shell_state(shell: ShellService) -> None:
    async with episode(shell) as parent:
        await step(parent, "bash", command="mkdir w && cd w && echo base > f && export V=1")
        left, right = await parent.afork(2)
        try:
            assert len({parent.shell_session, left.shell_session, right.shell_session}) == 3
            assert await step(left, "bash", command='echo "$V $(cat f)"') == "1 base\n"
            await step(left, "bash", command="echo left > f")
            assert await step(right, "bash", command="cat f") == "base\n"
            assert await step(parent, "bash", command="cat f") == "base\n"
        finally:
            await left.aclose()
            await right.aclose()


async def test_without_an_episode_each_call_gets_a_session_closed_after(
    shell: ShellService,
) -> None:
    before = shell.stats()["sessions"]
    bash = bash_tool(shell)
    assert await bash.acall(command="echo hi > f && cat f") == "hi\n"
    assert "No such file" in await bash.acall(command="cat f")
    edit = str_replace_tool(shell)
    with pytest.raises(Exception, match="f does not exist; nothing was changed"):
        await edit.acall(path="f", old_str="a", new_str="b")
    assert shell.stats()["sessions"] == before


async def test_a_runaway_command_times_out_and_the_episode_goes_on() -> None:
    with ShellService(pool_size=1, timeout=1.0) as quick:
        async with episode(quick) as ep:
            await step(ep, "write_file", path="kept.txt", content="still here")
            text = await step(ep, "bash", command="echo started; sleep 60")
            assert text.startswith("Error") and "timed out" in text
            assert "started" in text
            assert await step(ep, "bash", command="cat kept.txt") == "still here"
            assert ep.metrics.failed_calls == 1


async def test_tool_env_items_are_episodes_with_their_own_shells(shell: ShellService) -> None:
    env = ToolEnv(shell_tools(shell), parser=None, max_turns=3)
    env.reset(["first", "second"])
    try:
        await env.astep(
            [call("bash", command="echo one > who"), call("bash", command="echo two > who")]
        )
        out = await env.astep([call("bash", command="cat who")] * 2)
        assert [m[-1]["content"] for m in out.tool_messages] == ["one\n", "two\n"]
        sessions = [e.shell_session for e in env.episodes]
    finally:
        await env.aclose()
    assert not any([await shell.aclose_session(s or "") for s in sessions])


def test_tools_on_two_services_are_refused(shell: ShellService) -> None:
    with ShellService(pool_size=1) as other, pytest.raises(UserError, match="different Shell"):
        Episode([bash_tool(shell), bash_tool(other, name="bash2")])


def test_trl_environment_methods_run_in_one_shell_per_rollout(shell: ShellService) -> None:
    """The TRL adapter (which does not import TRL): one typed method per shell tool."""
    import inspect

    from toolservices.trainers.trl import trl_environment

    env_class = trl_environment(shell_tools(shell))
    params = inspect.signature(env_class.read_file).parameters
    assert list(params) == ["self", "path", "start_line", "end_line"]
    env = env_class()
    try:
        env.reset()
        assert env.write_file(path="a.txt", content="x = 1\n").startswith("Wrote 6 bytes")
        assert env.str_replace(path="a.txt", old_str="1", new_str="2").startswith("Edited")
        assert env.bash(command="cat a.txt") == "x = 2\n"
        first = env.episode.shell_session
        env.reset()  # the next rollout: a new session, the old one closed
        assert env.episode.shell_session != first
        assert "No such file" in env.bash(command="cat a.txt")
        assert not shell.close_session(first or "")
    finally:
        env_class.close_all()


async def test_oversized_binary_and_missing_files_answer_with_a_reason() -> None:
    with ShellService(pool_size=1, timeout=10.0, max_file_size=64 * 1024) as small:
        async with episode(small) as ep:
            await step(
                ep, "bash", command="head -c 200000 /dev/zero > big; printf 'a\\xff\\x00b\\n' > bin"
            )
            big = await step(ep, "read_file", path="big")
            assert big == (
                "Error: big is too large for read_file (more than 65536 bytes); "
                "look at parts of it with bash, e.g. sed -n '1,200p' big"
            )
            binary = await step(ep, "read_file", path="bin")
            assert binary == (  # named, not shown as numbered mojibake
                "[bin is a binary file (binary data, 5 bytes): not shown. "
                "Inspect it with bash, e.g. file bin; xxd bin | head]"
            )
            edit = await step(ep, "str_replace", path=".", old_str="a", new_str="b")
            assert edit == "Error: . is a directory; str_replace edits a file."
            # the episode goes on: a failed call is a message, not a broken session
            assert await step(ep, "bash", command="echo fine") == "fine\n"
