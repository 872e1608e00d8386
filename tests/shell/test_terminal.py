"""A shell session looks like a normal terminal (issue #23, section 4).

HOME is private and outside the workspace (and copied by ``fork_session``),
the sandbox user has a passwd entry, git has an identity, aliases expand,
``nproc`` is not capped by the executor's thread variables, and pip fails at
once without a network.
"""

from __future__ import annotations

from toolservices.shell import ShellService


def test_home_is_private_and_outside_the_repository(shell: ShellService, sid: str) -> None:
    res = shell.run(
        'echo "$HOME"; stat -c %a "$HOME"; git init -q repo && cd repo && '
        "git config --global core.editor true && touch a && git add -A && "
        "git status --short",
        session_id=sid,
    )
    assert res.returncode == 0, res
    home, mode, *status = res.stdout.split("\n")
    assert home == "/tmp/home" and mode == "700"
    assert [line for line in status if line] == ["A  a"]  # no .gitconfig in the repository
    assert shell.run("ls -a ~", session_id=sid).stdout.split() == [".", "..", ".gitconfig"]
    shell.close_session(sid)


def test_the_sandbox_user_has_a_name(shell: ShellService, sid: str) -> None:
    res = shell.run(
        "whoami; id -un; id -gn; "
        "python3 -c 'import os, pwd; print(pwd.getpwuid(os.getuid()).pw_name)'",
        session_id=sid,
    )
    assert res.stdout.split() == ["sandbox"] * 4, res
    shell.close_session(sid)


def test_git_has_a_default_identity_that_can_be_overridden(shell: ShellService, sid: str) -> None:
    script = (
        "git init -q r && cd r && git commit -q --allow-empty -m one && "
        "git log -1 --format='%an <%ae>'"
    )
    assert shell.run(script, session_id=sid).stdout == "sandbox <sandbox@localhost>\n"
    res = shell.run(
        "git config --global user.name Ada && git commit -q --allow-empty -m two && "
        "GIT_AUTHOR_NAME=Env git commit -q --allow-empty -m three && "
        "git log --format=%an -3",
        session_id=sid,
    )
    assert res.stdout.split() == ["Env", "Ada", "sandbox"], res
    shell.close_session(sid)


def test_home_is_copied_by_fork_session(shell: ShellService, sid: str) -> None:
    shell.run("echo kept > ~/notes; git config --global user.name Forked", session_id=sid)
    (copy,) = shell.fork_session(sid, 1)
    try:
        res = shell.run("cat ~/notes; git config --global user.name", session_id=copy)
        assert res.stdout == "kept\nForked\n", res
        shell.run("echo copy > ~/notes", session_id=copy)
        assert shell.run("cat ~/notes", session_id=sid).stdout == "kept\n"  # private to each
    finally:
        shell.close_session(copy)
        shell.close_session(sid)


def test_aliases_expand_and_nproc_is_honest(shell: ShellService, sid: str) -> None:
    shell.run("alias ll='echo listed'", session_id=sid)
    assert shell.run("ll", session_id=sid).stdout == "listed\n"
    res = shell.run("nproc; echo ${OMP_NUM_THREADS:-unset}", session_id=sid)
    count, omp = res.stdout.split()
    assert int(count) >= 1 and omp == "unset"
    shell.close_session(sid)


def test_pip_fails_at_once_without_a_network(shell: ShellService, sid: str) -> None:
    res = shell.run("python3 -m pip download --no-deps -d /tmp/x more-itertools", session_id=sid)
    assert res.returncode != 0
    assert "from versions: none" in res.stdout + res.stderr, res
    assert "Retrying" not in res.stdout + res.stderr  # no index asked: no DNS retries
    shell.close_session(sid)


def test_the_report_says_what_fork_copies_share(shell: ShellService) -> None:
    report = shell.isolation_report()
    joined = " ".join(report["not_protected"])
    assert "share their source's /tmp" not in joined
    assert "copies made by fork_session are fresh sessions" in joined
    nproc = report["layers"]["nproc_limit"]
    if nproc["active"] and "per session" in nproc["detail"]:
        assert "each fork_session copy has its own" in nproc["detail"]
