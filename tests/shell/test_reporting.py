"""Honest answers: lost state reported by the next command, a command that drives its session
out of memory gets a result, arguments no file or text can be are the caller's error."""

from __future__ import annotations

import json
import os
import time
import uuid
from collections.abc import Iterator

import pytest

from toolservices.errors import InfrastructureError, UserError
from toolservices.python import SandboxConfig
from toolservices.shell import ShellArgumentError, ShellFileError, ShellService


def new_sid() -> str:
    return f"r-{uuid.uuid4().hex[:8]}"


@pytest.fixture(scope="module")
def small() -> Iterator[ShellService]:
    svc = ShellService(pool_size=1, timeout=20.0, sandbox=SandboxConfig(memory_limit=256 << 20))
    try:
        yield svc
    finally:
        svc.close()


#: 600 MiB in memfds (each under the 64 MiB file size limit), none of it mapped
_MEMFD_FLOOD = (
    "import os\n"
    "fds = [os.memfd_create('flood') for _ in range(12)]\n"
    "for fd in fds:\n"
    "    for _ in range(50):\n"
    "        os.write(fd, b'x' * (1 << 20))\n"
)


def test_state_lost_between_commands_is_reported_by_the_next_one(small: ShellService) -> None:
    """A background job drives the session out of memory while no command runs: the file
    call after it lands in a fresh session (and cannot say so), the next command does."""
    if not small.isolation_report()["layers"]["memory_cgroup"]["active"]:
        pytest.skip("no memory cgroup here: memfd pages are not counted against the session")
    sid = new_sid()
    small.write_file("flood.py", _MEMFD_FLOOD, session_id=sid)
    small.run(
        "echo kept > f; export V=1; (for _ in $(seq 1000); do [ -e go ] && break; sleep 0.01; "
        "done; python3 flood.py) >/dev/null 2>&1 &",
        session_id=sid,
    )
    before = small.stats()["shell_restarts"]
    small.write_file("go", "", session_id=sid)
    for _ in range(1000):  # bounded: 10 s, until the file calls find a fresh session
        try:
            small.read_file("f", session_id=sid)
        except (ShellFileError, InfrastructureError):  # gone, or going during the read
            break
        time.sleep(0.01)
    else:
        raise AssertionError("the session never ran out of memory")
    res = small.run('echo "${V:-unset}"; ls', session_id=sid)
    assert res.restarted, res
    assert res.stdout == "unset\n", res
    assert small.stats()["shell_restarts"] == before + 1
    assert not small.run("true", session_id=sid).restarted  # said once
    small.close_session(sid)


def test_a_command_that_drives_the_session_out_of_memory_gets_a_result(
    small: ShellService,
) -> None:
    if not small.isolation_report()["layers"]["memory_cgroup"]["active"]:
        pytest.skip("no memory cgroup here: memfd pages are not counted against the session")
    sid = new_sid()
    small.write_file("flood.py", _MEMFD_FLOOD, session_id=sid)
    small.run("export KEEP=1", session_id=sid)
    res = small.run("python3 flood.py; echo after", session_id=sid)
    assert not res.success, res
    if res.restarted:  # the supervisor was the process the kernel killed
        assert "restarted" in res.stderr and "memory" in res.stderr, res
        assert small.run('echo "${KEEP:-unset}"', session_id=sid).stdout == "unset\n"
    assert small.run("echo fine", session_id=sid).stdout == "fine\n"
    small.close_session(sid)


@pytest.mark.parametrize(
    "path",
    ["a\x00b", "bad\ud800.txt", "x/" * 2100 + "f"],
    ids=["nul", "lone-surrogate", "beyond-path-max"],
)
def test_paths_no_file_can_have_are_the_callers_error(shell: ShellService, path: str) -> None:
    sid = new_sid()
    calls = (
        lambda: shell.write_file(path, "x", session_id=sid),
        lambda: shell.read_file(path, session_id=sid),
        lambda: shell.list_files(path, session_id=sid),
    )
    for call in calls:
        with pytest.raises(ShellArgumentError) as info:
            call()
        assert isinstance(info.value, UserError) and isinstance(info.value, ShellFileError)
        assert info.value.reason in ("EINVAL", "ENAMETOOLONG")
    assert shell.run("ls | wc -l", session_id=sid).stdout == "0\n"
    shell.close_session(sid)


def test_text_that_is_no_text_is_refused_clearly(shell: ShellService) -> None:
    sid = new_sid()
    with pytest.raises(ShellArgumentError):
        shell.write_file("f.txt", "ok \ud800 not", session_id=sid)
    with pytest.raises(ShellArgumentError):
        shell.run("cat", session_id=sid, stdin="\udfff")
    res = shell.run("echo \ud800", session_id=sid)
    assert res.returncode == 2 and "lone surrogate" in res.stderr and not res.restarted
    shell.close_session(sid)


def test_deep_paths_within_the_limit_work(shell: ShellService) -> None:
    sid = new_sid()
    deep = "d/" * 1500 + "f.txt"  # 3,005 bytes: 1,500 directories made without recursion
    assert shell.write_file(deep, "deep", session_id=sid) == 4
    assert shell.read_file(deep, session_id=sid) == "deep"
    shell.close_session(sid)


def test_listed_names_are_valid_text_with_the_raw_bytes_beside(shell: ShellService) -> None:
    sid = new_sid()
    shell.run("printf one > $'\\xff\\xfe.txt'; printf two > ok.txt", session_id=sid)
    entries = shell.list_files(session_id=sid)
    json.dumps([e.name for e in entries]).encode("utf-8")  # what a harness does with them
    ok, odd = sorted(entries, key=lambda e: e.raw is not None)
    assert ok.name == "ok.txt" and ok.raw is None
    assert odd.name == "\ufffd\ufffd.txt" and odd.raw == b"\xff\xfe.txt"
    assert shell.read_file(os.fsdecode(odd.raw), session_id=sid) == "one"
    shell.close_session(sid)
