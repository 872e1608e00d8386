"""ShellService basics: persistent shell state, results, stdin, files, forks, close."""

from __future__ import annotations

import anyio
import pytest

from toolservices import ShellResult as TopLevelShellResult
from toolservices import ShellService as TopLevelShellService
from toolservices.errors import ExecutorBusyError, UserError
from toolservices.shell import FileEntry, ShellFileError, ShellResult, ShellService


def test_exported_at_top_level() -> None:
    assert TopLevelShellService is ShellService
    assert TopLevelShellResult is ShellResult


def test_state_persists_between_commands(shell: ShellService, sid: str) -> None:
    first = shell.run(
        "mkdir -p sub && cd sub && export GREETING=hi && X=1 && f() { echo fn; }", session_id=sid
    )
    assert first.success and not first.restarted
    second = shell.run('echo "$GREETING $X"; f; basename "$PWD"', session_id=sid)
    assert second.stdout == "hi 1\nfn\nsub\n"
    assert second["returncode"] == 0 and second["success"]


def test_result_is_a_mapping_with_the_contract_keys(shell: ShellService) -> None:
    res = shell.run("echo out; echo err >&2; exit 3")
    assert dict(res) == res.to_dict()
    assert set(res) >= {
        "success",
        "stdout",
        "stderr",
        "returncode",
        "timed_out",
        "truncated",
        "restarted",
        "duration",
    }
    assert (res.success, res.stdout, res.stderr, res.returncode) == (False, "out\n", "err\n", 3)


def test_without_a_session_each_command_gets_a_fresh_shell(shell: ShellService) -> None:
    shell.run("export LEAK=1; echo x > leak.txt")
    res = shell.run('echo "[$LEAK]"; ls')
    assert res.stdout == "[]\n"


def test_stdin_is_closed_unless_given(shell: ShellService) -> None:
    assert shell.run("cat; echo end", timeout=5).stdout == "end\n"
    assert shell.run("cat", stdin="hello\n").stdout == "hello\n"
    assert shell.run("wc -c", stdin=b"\x00" * 200_000).stdout.strip() == "200000"


def test_exit_keeps_the_state_before_it(shell: ShellService, sid: str) -> None:
    shell.run("export KEEP=1", session_id=sid)
    res = shell.run("export LATER=2; exit 5", session_id=sid)
    assert res.returncode == 5 and not res.restarted
    assert shell.run('echo "$KEEP $LATER"', session_id=sid).stdout == "1 2\n"


def test_a_later_command_can_signal_an_earlier_background_job(
    shell: ShellService, sid: str
) -> None:
    shell.run("sleep 60 & echo $! > job.pid", session_id=sid)
    res = shell.run("kill $(cat job.pid) && echo killed; wait; echo $?", session_id=sid)
    assert res.stdout.startswith("killed\n"), res


def test_timeout_kills_the_command_and_files_survive(shell: ShellService, sid: str) -> None:
    shell.run("export KEEP=1; echo data > kept.txt", session_id=sid)
    res = shell.run("export LOST=1; sleep 30", session_id=sid, timeout=0.5)
    assert res.timed_out and not res.success and res.returncode == -1 and res.restarted
    after = shell.run('echo "$KEEP[$LOST]"; cat kept.txt', session_id=sid)
    assert after.stdout == "1[]\ndata\n" and not after.restarted


def test_the_command_after_a_timeout_gets_a_live_shell(shell: ShellService, sid: str) -> None:
    # The next command's bash is started while a command runs; a timeout's tree kill
    # must not leave it dead for the next command (it came back killed, -9, restarted).
    for _ in range(4):
        late = shell.run("sleep 30", session_id=sid, timeout=0.5)
        assert late.timed_out
        after = shell.run("echo ok", session_id=sid, timeout=10)
        assert (after.stdout, after.returncode, after.restarted) == ("ok\n", 0, False), after


def test_file_tools_round_trip(shell: ShellService, sid: str) -> None:
    assert shell.write_file("dir/a.txt", "héllo\n", session_id=sid) == len("héllo\n".encode())
    assert shell.read_file("dir/a.txt", session_id=sid) == "héllo\n"
    assert shell.run("cat dir/a.txt", session_id=sid).stdout == "héllo\n"
    shell.write_file("dir/b.bin", b"\xff\x00", session_id=sid)
    assert shell.read_file("dir/b.bin", session_id=sid, binary=True) == b"\xff\x00"
    assert shell.list_files("dir", session_id=sid) == [
        FileEntry(name="a.txt", kind="file", size=7),
        FileEntry(name="b.bin", kind="file", size=2),
    ]
    with pytest.raises(ShellFileError) as info:
        shell.read_file("missing.txt", session_id=sid)
    assert info.value.reason == "ENOENT" and "missing.txt" in str(info.value)


def test_fork_copies_files_and_state(shell: ShellService, sid: str) -> None:
    shell.run("mkdir -p w && cd w && echo v1 > f.txt && export V=1", session_id=sid)
    (copy,) = shell.fork_session(sid, 1)
    res = shell.run('cat f.txt; echo "$V"; echo v2 > f.txt', session_id=copy)
    assert res.stdout == "v1\n1\n", res
    assert shell.run("cat f.txt", session_id=sid).stdout == "v1\n"
    assert shell.close_session(copy) is True


def test_close_session(shell: ShellService, sid: str) -> None:
    shell.run("echo x > f", session_id=sid)
    assert shell.close_session(sid) is True
    assert shell.close_session(sid) is False
    assert shell.run("ls", session_id=sid).stdout == ""


def test_bad_arguments_are_user_errors(shell: ShellService) -> None:
    with pytest.raises(UserError):
        shell.run(["ls"])  # type: ignore[arg-type]
    with pytest.raises(UserError):
        shell.run("ls", timeout=0)
    with pytest.raises(UserError):
        shell.read_file("x", session_id="")


async def test_async_faces(shell: ShellService, sid: str) -> None:
    res = await shell.arun("cd /tmp", session_id=sid)
    assert res.success
    assert (await shell.arun("pwd", session_id=sid)).stdout == "/tmp\n"
    await shell.awrite_file("a", "1", session_id=sid)
    assert await shell.aread_file("a", session_id=sid) == "1"
    assert [e.name for e in await shell.alist_files(session_id=sid)] == ["a"]
    copies = await shell.afork_session(sid, 2)
    assert len(copies) == 2
    assert await shell.aclose_session(sid) is True


def test_eviction_says_restarted() -> None:
    with ShellService(pool_size=1, timeout=10.0, max_sessions=1, spares=0) as small:
        small.run("export A=1; echo x > f", session_id="one")
        small.run("true", session_id="two")  # evicts "one"
        res = small.run('echo "[$A]"; ls', session_id="one")
        assert res.restarted and res.stdout == "[]\n"
        assert small.stats()["evictions"] >= 1


def test_stats_count_commands(shell: ShellService, sid: str) -> None:
    before = shell.stats()
    shell.run("false", session_id=sid)
    shell.run("sleep 5", session_id=sid, timeout=0.2)
    after = shell.stats()
    assert after["shell_commands"] - before["shell_commands"] == 2
    assert after["shell_failures"] - before["shell_failures"] == 2
    assert after["shell_timeouts"] - before["shell_timeouts"] == 1


async def test_busy_service_raises_executor_busy() -> None:
    async with ShellService(pool_size=1, timeout=10.0, max_queue=1) as small:
        await small.arun("true", session_id="warm")
        outcomes: list[object] = []

        async def call(i: int) -> None:
            try:
                outcomes.append(await small.arun("sleep 0.5", session_id=f"s{i}"))
            except ExecutorBusyError as exc:
                outcomes.append(exc)

        async with anyio.create_task_group() as tg:
            for i in range(4):
                tg.start_soon(call, i)
        busy = [o for o in outcomes if isinstance(o, ExecutorBusyError)]
        assert busy and all(b.retryable for b in busy)


def test_background_job_printing_later_is_not_killed(shell: ShellService, sid: str) -> None:
    """Its command's pipes stay open (drained): no SIGPIPE when it prints after returning."""
    shell.run(
        "(until [ -e go ]; do sleep 0.02; done; seq 2000; echo err >&2; touch printed) &",
        session_id=sid,
    )
    res = shell.run("touch go; until [ -e printed ]; do sleep 0.02; done; echo ok", session_id=sid)
    assert res.stdout == "ok\n" and not res.timed_out, res


def test_isolation_report_has_the_shell_layers(shell: ShellService) -> None:
    layers = shell.isolation_report()["layers"]
    assert {"disk_quota", "command_scope", "seccomp", "landlock"} <= set(layers)
    if layers["session_namespaces"]["active"]:
        assert layers["disk_quota"]["active"]
