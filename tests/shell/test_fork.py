"""The workspace's fixed path, and fork_session: fresh sessions seeded with the source's files
and shell state (own namespaces, own quota, nothing shared with the source afterwards)."""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Iterator

import pytest

from toolservices.errors import UserError
from toolservices.python.sandbox import default_config
from toolservices.shell import ShellFileError, ShellService

#: the processes of the calling session (its own PID namespace: it sees no other session's)
_OWN_PROCESSES = 'for p in /proc/[0-9]*; do tr "\\0" " " < "$p/cmdline"; echo; done'


def new_sid() -> str:
    return f"f-{uuid.uuid4().hex[:8]}"


@pytest.fixture(scope="module")
def fixed(shell: ShellService) -> str:
    """The fixed workspace path; these tests need session namespaces to have one."""
    where = shell.isolation_report().get("workspace")
    if where is None:
        pytest.skip("no session namespaces here: each workspace has its own path")
    return str(where)


@pytest.fixture
def src(shell: ShellService) -> Iterator[str]:
    sid = new_sid()
    yield sid
    shell.close_session(sid)


def test_workspace_is_at_the_same_path_in_fresh_sessions_and_copies(
    shell: ShellService, fixed: str, src: str
) -> None:
    other = new_sid()
    shell.write_file("note.txt", "from the tool", session_id=src)
    (copy,) = shell.fork_session(src, 1)
    for sid in (src, other, copy):
        assert shell.workspace(sid) == fixed
        res = shell.run('pwd; echo "$HOME"; echo "$TMPDIR"', session_id=sid)
        assert res.stdout == f"{fixed}\n/tmp/home\n{fixed}\n", res  # HOME: outside it
    # relative paths of the file tools resolve there, in each session its own files
    assert shell.run(f"cat {fixed}/note.txt", session_id=copy).stdout == "from the tool"
    shell.write_file("sub/x.txt", "copy", session_id=copy)
    assert shell.read_file(f"{fixed}/sub/x.txt", session_id=copy) == "copy"
    with pytest.raises(ShellFileError):
        shell.read_file("sub/x.txt", session_id=src)
    with pytest.raises(ShellFileError):
        shell.read_file("note.txt", session_id=other)
    shell.close_session(other)
    shell.close_session(copy)


def test_copy_has_the_files_cwd_variables_functions_aliases_and_options(
    shell: ShellService, src: str
) -> None:
    setup = (
        "mkdir -p a/b && echo v1 > a/b/f.txt && cd a/b && export V=1 && LOCAL=2 && "
        "greet() { echo \"hi $1\"; } && alias ll='echo aliased' && set -o noclobber && "
        "shopt -s extglob"
    )
    assert shell.run(setup, session_id=src).success
    copies = shell.fork_session(src, 2)
    for copy in copies:
        res = shell.run(
            'pwd; cat f.txt; echo "$V $LOCAL"; greet you; alias ll; '
            "[[ -o noclobber ]] && echo noclobber; shopt -q extglob && echo extglob",
            session_id=copy,
        )
        assert res.stdout.splitlines() == [
            f"{shell.workspace(copy)}/a/b",
            "v1",
            "1 2",
            "hi you",
            "alias ll='echo aliased'",
            "noclobber",
            "extglob",
        ], res
        assert not res.restarted
        shell.close_session(copy)


def test_writes_are_seen_by_nobody_else(shell: ShellService, src: str) -> None:
    shell.run("echo base > f", session_id=src)
    left, right = shell.fork_session(src, 2)
    shell.run("echo left > f; echo l > only-left", session_id=left)
    shell.run("echo right > f; rm -f only-left", session_id=right)
    shell.run("echo source > f; echo s > only-source", session_id=src)
    assert shell.run("cat f; ls", session_id=left).stdout == "left\nf\nonly-left\n"
    assert shell.run("cat f; ls", session_id=right).stdout == "right\nf\n"
    assert shell.run("cat f; ls", session_id=src).stdout == "source\nf\nonly-source\n"
    shell.close_session(left)
    shell.close_session(right)


def test_each_copy_has_its_own_disk_quota(fixed: str) -> None:
    with ShellService(pool_size=2, timeout=20.0, disk_quota=24 << 20) as small:
        assert small.run("head -c 8M /dev/zero > blob && echo ok", session_id="src").success
        one, two = small.fork_session("src", 2)
        full = small.run("head -c 30M /dev/zero > fill", session_id=one)
        assert not full.success and "No space left" in full.stderr, full
        # the others still have their 16 MB of room: nothing of the quota is shared
        for sid in ("src", two):
            res = small.run("head -c 12M /dev/zero > more && echo ok", session_id=sid)
            assert res.stdout == "ok\n", res
        # and a copy of a session holding more than half the quota works (it was ENOSPC)
        (three,) = small.fork_session(two, 1)
        assert small.run("du -sm blob more | cut -f1", session_id=three).stdout == "8\n12\n"


def test_closing_the_source_leaves_the_copies_alone(shell: ShellService) -> None:
    source = new_sid()
    shell.run("echo kept > f && export K=1", session_id=source)
    (copy,) = shell.fork_session(source, 1)
    assert shell.close_session(source) is True
    assert shell.run('cat f; echo "$K"', session_id=copy).stdout == "kept\n1\n"
    assert shell.close_session(copy) is True
    assert shell.close_session(copy) is False


def test_background_processes_are_not_copied(shell: ShellService, fixed: str, src: str) -> None:
    shell.run("sleep 300 &", session_id=src)
    assert "sleep 300" in shell.run(_OWN_PROCESSES, session_id=src).stdout
    (copy,) = shell.fork_session(src, 1)
    assert "sleep" not in shell.run(_OWN_PROCESSES, session_id=copy).stdout
    shell.close_session(copy)


def test_copy_keeps_modes_links_holes_and_times(fixed: str) -> None:
    setup = (
        "printf '#!/bin/sh\\necho ran\\n' > run.sh && chmod 750 run.sh && "
        "echo data > a && ln a hard && truncate -s 48M sparse && echo tail >> sparse && "
        "touch -d 2001-02-03T04:05:06 old && mkdir ro && echo in > ro/x && chmod 500 ro && "
        "mkfifo pipe && echo secret > closed && chmod 000 closed"
    )
    with ShellService(pool_size=2, timeout=20.0, disk_quota=16 << 20) as small:
        assert small.run(setup, session_id="src").success
        (copy,) = small.fork_session("src", 1)  # 48 MB sparse in a 16 MB quota: holes stay
        res = small.run(
            "./run.sh; stat -c '%a %h %n' run.sh a hard ro; cat ro/x; "
            "date -u -r old +%Y-%m-%dT%H:%M:%S; tail -c 5 sparse; ls pipe closed 2>&1 | sort",
            session_id=copy,
        )
        assert res.stdout.splitlines() == [
            "ran",
            "750 1 run.sh",
            "644 2 a",
            "644 2 hard",
            "500 2 ro",
            "in",
            "2001-02-03T04:05:06",
            "tail",
            "ls: cannot access 'closed': No such file or directory",
            "ls: cannot access 'pipe': No such file or directory",
        ], res


@pytest.mark.parametrize(
    ("link", "target"),
    [("shadow", "/etc/shadow"), ("root", "/"), ("proc", "/proc/1/root"), ("bin", "/usr/bin")],
)
def test_symlinks_are_copied_as_links_never_followed(
    shell: ShellService, src: str, link: str, target: str
) -> None:
    shell.run(f"ln -s {target} {link}", session_id=src)
    (copy,) = shell.fork_session(src, 1)
    res = shell.run(f"readlink {link}; [ -L {link} ] && echo link", session_id=copy)
    assert res.stdout == f"{target}\nlink\n", res
    # through the link the copy reaches what its own shell reaches: the same as a fresh one
    probe = f"cat {link} 2>&1 | head -c 200; ls {link}/ 2>&1 | head -5"
    fresh = new_sid()
    shell.run(f"ln -s {target} {link}", session_id=fresh)
    assert shell.run(probe, session_id=copy).stdout == shell.run(probe, session_id=fresh).stdout
    if link == "shadow":
        with pytest.raises(ShellFileError):
            shell.read_file(link, session_id=copy)
    shell.close_session(fresh)
    shell.close_session(copy)


def test_a_copy_cannot_reach_the_source(shell: ShellService, fixed: str, src: str) -> None:
    """No path, descriptor or process of the source is left to a copy."""
    shell.run("sleep 300 &", session_id=src)
    (copy,) = shell.fork_session(src, 1)
    shell.run("echo after-the-fork > f", session_id=src)
    res = shell.run(
        # (targets only: the owner column names the sandbox user now)
        f"ls -l /proc/self/fd/ | grep -e {fixed} -e '> /sandbox'; "
        f"for p in /proc/[0-9]*; do cat $p/root{fixed}/f $p/cwd/f 2>/dev/null; done; echo end",
        session_id=copy,
    )
    assert res.stdout == "end\n", res
    shell.run("echo changed > f", session_id=copy)
    assert shell.run("cat f", session_id=src).stdout == "after-the-fork\n"
    shell.close_session(copy)


async def test_async_fork(shell: ShellService, src: str) -> None:
    await shell.arun("cd /tmp && export A=1 && echo x > $HOME/f", session_id=src)
    copies = await shell.afork_session(src, 2)
    for copy in copies:
        res = await shell.arun('pwd; echo "$A"; cat ~/f', session_id=copy)
        assert res.stdout == "/tmp\n1\nx\n", res
        assert await shell.aclose_session(copy) is True


@pytest.mark.parametrize(
    ("changes", "expected"),
    [({"bwrap": False}, "/tmp/workspace"), ({"session_namespaces": False}, None)],
    ids=["L2", "no-session-namespaces"],
)
def test_workspace_path_at_other_levels(changes: dict[str, object], expected: str | None) -> None:
    """L2 has no /workspace mount point (the host's root): /tmp/workspace, in the session's
    own /tmp. Without session namespaces each workspace has its own path, and a copy's state
    has the source's path rewritten to its own."""
    config = dataclasses.replace(default_config(), **changes)  # type: ignore[arg-type]
    with ShellService(pool_size=2, timeout=10.0, sandbox=config) as svc:
        report = svc.isolation_report()
        if expected is not None and not report["layers"]["session_namespaces"]["active"]:
            pytest.skip("no session namespaces here")
        assert report.get("workspace") == expected
        svc.run('mkdir -p a/b && cd a/b && echo hi > f && export WHERE="$PWD"', session_id="s")
        (copy,) = svc.fork_session("s", 1)
        here = svc.workspace(copy)
        assert (here == svc.workspace("s")) == (expected is not None)
        if expected is not None:
            assert here == expected
        res = svc.run('pwd; echo "$WHERE"; cat f; echo x > g', session_id=copy)
        assert res.stdout == f"{here}/a/b\n{here}/a/b\nhi\n", res
        assert svc.run("ls", session_id="s").stdout == "f\n"  # the source's a/b is untouched


def test_a_source_swapping_links_while_copied_gets_no_more(shell: ShellService, src: str) -> None:
    """A background job of the source swaps a directory for a symlink to /etc and back
    while copies are made: each copy has a directory or the link, never /etc's files."""
    shell.run(
        "mkdir d && touch d/f && (while :; do rm -rf d; ln -s /etc d; rm d; mkdir d; "
        "touch d/f; done) >/dev/null 2>&1 &",
        session_id=src,
    )
    for _ in range(5):
        (copy,) = shell.fork_session(src, 1)
        res = shell.run("if [ -L d ]; then readlink d; else ls -A d; fi", session_id=copy)
        assert res.stdout in ("", "f\n", "/etc\n"), res
        shell.close_session(copy)


def test_fork_of_an_unknown_or_evicted_session_is_refused(shell: ShellService) -> None:
    from toolservices.errors import UserError

    before = shell.stats()["sessions"]
    with pytest.raises(UserError, match="unknown session"):
        shell.fork_session(new_sid(), 1)
    assert shell.stats()["sessions"] == before  # nothing made on the way
    with ShellService(pool_size=1, max_sessions=2, spares=0) as small:
        for sid in ("a", "b", "c"):  # "a" is evicted, its files and state gone
            assert small.run("echo x > f", session_id=sid).success
        with pytest.raises(UserError, match="unknown session"):
            small.fork_session("a", 1)
        (copy,) = small.fork_session("c", 1)  # evicts "b" for room: still a whole copy
        assert small.run("cat f", session_id=copy).stdout == "x\n"


_WRITE_LEASE = (
    "import fcntl, os, signal, sys, time\n"
    "signal.signal(signal.SIGIO, signal.SIG_IGN)\n"
    "fd = os.open(sys.argv[1], os.O_RDONLY)\n"
    "fcntl.fcntl(fd, fcntl.F_SETLEASE, fcntl.F_WRLCK)\n"
    "open('held', 'w').close()\n"
    "time.sleep(60)\n"
)


def test_a_leased_file_does_not_fail_the_fork(shell: ShellService, src: str) -> None:
    """A write lease makes every other open wait: the copy skips that file, the rest travels."""
    shell.write_file("lease.py", _WRITE_LEASE, session_id=src)
    res = shell.run(
        "echo other > other; echo leased > leased; (python3 lease.py leased &); "
        "for _ in $(seq 500); do [ -e held ] && break; sleep 0.01; done; ls held",
        session_id=src,
    )
    assert res.stdout == "held\n", res
    (copy,) = shell.fork_session(src, 1)
    assert shell.run("cat other; ls leased", session_id=copy).stdout == "other\n"
    shell.close_session(copy)


def test_a_shell_state_beyond_one_reply_travels_in_parts(shell: ShellService, src: str) -> None:
    """23 MB in one variable: more than the session's largest reply (about 21 MB here)."""
    res = shell.run(
        "BIG=$(head -c 23000000 /dev/zero | tr '\\0' x); export SMALL=1; echo ${#BIG}",
        session_id=src,
        timeout=30,
    )
    assert res.stdout == "23000000\n", res
    (copy,) = shell.fork_session(src, 1)
    res = shell.run('echo "${#BIG} $SMALL ${BIG:0:3}"', session_id=copy, timeout=30)
    assert res.stdout == "23000000 1 xxx\n", res
    shell.close_session(copy)


def test_a_state_too_large_for_any_copy_names_its_largest_variable(
    shell: ShellService, src: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from toolservices.shell import _service

    monkeypatch.setattr(_service, "_MAX_STATE", 20_000)  # the real one: 48 Mi characters
    shell.run("HUGE_ONE=$(head -c 30000 /dev/zero | tr '\\0' y); small=1", session_id=src)
    with pytest.raises(UserError, match="HUGE_ONE"):
        shell.fork_session(src, 2)
    assert shell.run("echo ${#HUGE_ONE}", session_id=src).stdout == "30000\n"  # src unharmed
