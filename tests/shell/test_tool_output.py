"""What the model reads from the shell tools (issue #23, sections 3, 5 and 6).

Head and tail around ``[... N bytes omitted ...]`` (a test run's summary is at
the end), a model-facing cap per tool, binary files named rather than shown,
per-tool and per-call timeouts, and the messages a model acts on.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pytest

from toolservices import ToolError, ToolTimeoutError, shell_tools
from toolservices.env import bash_tool, clip_middle
from toolservices.errors import UserError
from toolservices.shell import ShellService


@pytest.fixture(scope="module")
def small() -> Iterator[ShellService]:
    """A service keeping 4 KiB per stream, so that the cut is cheap to see."""
    with ShellService(pool_size=2, timeout=20.0, max_output=4096, max_sessions=16) as svc:
        yield svc


def omitted(text: str) -> int:
    found = re.findall(r"\[\.\.\. (\d+) bytes omitted \.\.\.\]", text)
    assert len(found) == 1, text
    return int(found[0])


def test_the_service_keeps_head_and_tail(small: ShellService, sid: str) -> None:
    res = small.run("seq 1 100000", session_id=sid)
    total = len("".join(f"{i}\n" for i in range(1, 100001)))
    assert res.truncated
    assert res.stdout.startswith("1\n2\n3\n") and res.stdout.endswith("99999\n100000\n")
    assert omitted(res.stdout) == total - 4096
    small.close_session(sid)


def test_a_short_stream_is_whole(small: ShellService, sid: str) -> None:
    res = small.run("printf 'x%.0s' $(seq 4096)", session_id=sid)  # exactly the cap
    assert res.stdout == "x" * 4096 and not res.truncated
    small.close_session(sid)


async def call(tool: Any, session: str, **args: Any) -> str:
    return str(await tool.acall(**args, _state={"shell_session": session}))


async def test_the_model_reads_a_capped_output_with_its_summary(
    shell: ShellService, sid: str
) -> None:
    (bash, *_rest) = shell_tools(shell, max_output=2048)
    text = await call(
        bash, sid, command="yes flood | head -c 300000; echo '== 1 failed, 99 passed =='; exit 1"
    )
    assert text.startswith("flood\nflood\n")
    assert text.endswith("== 1 failed, 99 passed ==\n[exit status 1]")
    assert len(text.encode()) < 2048 + 100
    # the service kept 64 KiB of the 300,026 bytes, the tool 2 KiB of those: both cuts counted
    marker = f"\n[... {omitted(text)} bytes omitted ...]\n"
    kept = len(text.encode()) - len(marker) - len("[exit status 1]")
    assert kept + omitted(text) == 300_000 + len("== 1 failed, 99 passed ==\n")
    # the default: 16 KiB, enough for a normal listing, not for a flood
    default = bash_tool(shell)
    assert default.max_output == 16 * 1024
    flood = await call(default, sid, command="seq 1 200000")
    assert len(flood.encode()) < 17 * 1024 and flood.endswith("200000\n")
    await shell.aclose_session(sid)


async def test_stderr_and_stdout_share_the_cap(shell: ShellService, sid: str) -> None:
    bash = bash_tool(shell, max_output=1024)
    text = await call(bash, sid, command="seq 1 5000; echo warned >&2")
    assert text.endswith("[stderr]\nwarned\n") and "5000\n" in text  # the short stream whole
    await shell.aclose_session(sid)


def test_clip_middle_keeps_whole_characters() -> None:
    assert clip_middle("short", 64) == "short"
    clipped = clip_middle("é" * 100, 65)
    assert clipped.startswith("é" * 16) and clipped.endswith("é" * 16)
    assert omitted(clipped) == 200 - 65
    assert clip_middle("x" * 100, None) == "x" * 100


async def test_read_file_names_a_binary_file(shell: ShellService, sid: str) -> None:
    read = next(t for t in shell_tools(shell) if t.name == "read_file")
    await shell.awrite_file("prog", b"\x7fELF\x02\x01\x01" + bytes(300), session_id=sid)
    await shell.awrite_file("blob", bytes(range(256)) * 4, session_id=sid)
    text = await call(read, sid, path="prog")
    assert text == (
        "[prog is a binary file (ELF executable or library, 307 bytes): not shown. "
        "Inspect it with bash, e.g. file prog; xxd prog | head]"
    )
    assert "binary file (binary data, 1024 bytes)" in await call(read, sid, path="blob")
    await shell.awrite_file("latin", "café\n".encode("latin-1"), session_id=sid)
    assert "caf\ufffd" in await call(read, sid, path="latin")  # mostly text: shown
    await shell.aclose_session(sid)


async def test_str_replace_on_a_missing_file_says_so(shell: ShellService, sid: str) -> None:
    edit = next(t for t in shell_tools(shell) if t.name == "str_replace")
    with pytest.raises(ToolError) as caught:
        await call(edit, sid, path="nope.py", old_str="a", new_str="b")
    assert str(caught.value).startswith("nope.py does not exist; nothing was changed.")
    assert "read_file" not in str(caught.value)
    await shell.aclose_session(sid)


async def test_a_timeout_note_says_rolled_back(shell: ShellService, sid: str) -> None:
    bash = bash_tool(shell, timeout=1)
    await call(bash, sid, command="cd /tmp; export X=1")
    with pytest.raises(ToolTimeoutError) as caught:
        await call(bash, sid, command="cd /; export X=2; sleep 30")
    assert "rolled back to before this command" in str(caught.value)
    assert await call(bash, sid, command="pwd; echo $X") == "/tmp\n1\n"
    await shell.aclose_session(sid)


async def test_timeouts_per_tool_and_per_call(shell: ShellService, sid: str) -> None:
    quick = bash_tool(shell, timeout=2)
    assert quick.command_timeout == 2.0 and quick.timeout is not None
    assert quick.timeout < (bash_tool(shell).timeout or 0)
    assert "at most 2" in quick.schema_in["properties"]["timeout"]["description"]
    with pytest.raises(ToolTimeoutError):  # the tool's own limit, not the service's 10 s
        await call(quick, sid, command="sleep 8")
    with pytest.raises(ToolTimeoutError):  # the model may ask for less...
        await call(bash_tool(shell), sid, command="sleep 8", timeout=0.5)
    # ...never for more: 100 s asked, the tool's 2 s given
    res = await call(quick, sid, command="echo fast", timeout=100)
    assert res == "fast\n"
    with pytest.raises(ToolError, match="timeout must be a number"):
        await call(quick, sid, command="true", timeout=-1)
    with pytest.raises(UserError, match="timeout must be"):
        bash_tool(shell, timeout=0)
    with pytest.raises(UserError, match="max_output"):
        bash_tool(shell, max_output=3)
    await shell.aclose_session(sid)


def test_the_description_says_what_the_sandbox_has(shell: ShellService) -> None:
    text = bash_tool(shell).description
    assert "no network" in text and "On PATH: python3" in text
    assert "first and last 8 KiB" in text
