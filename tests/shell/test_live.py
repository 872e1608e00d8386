"""The live bash: commands run in copies of one bash that holds the state (issue 22).

Where the package carries its bash builtin (built with a C compiler), each
command is a copy of the session's master bash; without it (no compiler,
``TOOLSERVICES_SHELL_NATIVE=0``, an image, a bash that cannot load it) a fresh
bash per command, as before. Both ways keep the same guarantees: the rest of
tests/shell runs against whichever this checkout has (``.ci/run`` runs it
both ways).
"""

from __future__ import annotations

import pytest

from toolservices.shell import ShellService, _native, _service

needs_builtin = pytest.mark.skipif(
    _native.library() is None,
    reason="the shell's bash builtin is not built (no C compiler, or TOOLSERVICES_SHELL_NATIVE=0)",
)


@needs_builtin
def test_commands_are_copies_of_one_live_bash(shell: ShellService, sid: str) -> None:
    first = shell.run("X=1; cd /tmp; f() { echo fn; }; pgrep -cx ts-shell; echo $$", session_id=sid)
    roots, pid = first.stdout.split()
    assert roots == "1", first  # the session's root bash, and no spawner
    second = shell.run('echo "$X $PWD $(f) $$"; [ "$$" = "$BASHPID" ]', session_id=sid)
    assert second.success, second
    x, cwd, fn, own = second.stdout.split()
    assert (x, cwd, fn) == ("1", "/tmp", "fn") and own != pid  # each copy its own $$


@needs_builtin
def test_the_master_is_a_snapshot_a_lost_command_leaves_alone(
    shell: ShellService, sid: str
) -> None:
    assert shell.run("N=kept", session_id=sid).success
    for lost in ("N=gone; sleep 30", "N=gone; exec true", "N=gone; kill -9 $$"):
        res = shell.run(lost, session_id=sid, timeout=1.0)
        assert res.restarted, res
        assert shell.run('echo "$N"', session_id=sid).stdout == "kept\n"


@needs_builtin
def test_random_differs_between_copies(shell: ShellService, sid: str) -> None:
    seen = {shell.run("echo $RANDOM$RANDOM", session_id=sid).stdout for _ in range(4)}
    assert len(seen) == 4


def test_without_the_builtin_each_command_gets_a_bash(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TOOLSERVICES_SHELL_NATIVE", "0")
    with ShellService(pool_size=1, timeout=10.0, max_sessions=4) as svc:
        res = svc.run("X=1; pgrep -cx ts-shell", session_id="a")
        assert res.stdout == "0\n", res
        assert svc.run('echo "$X"', session_id="a").stdout == "1\n"


def test_a_bash_that_cannot_load_the_builtin_falls_back(monkeypatch: pytest.MonkeyPatch) -> None:
    # not a shared object: the root bash answers that it cannot serve, the session goes on
    monkeypatch.setattr(_native, "library", lambda: _service.__file__)
    with ShellService(pool_size=1, timeout=10.0, max_sessions=4, spares=0) as svc:
        res = svc.run("X=1; pgrep -cx ts-shell", session_id="a")
        assert res.stdout == "0\n" and not res.restarted, res
        assert svc.run('echo "$X"', session_id="a").stdout == "1\n"


def test_a_low_descriptor_limit_still_gets_the_commands_output(
    shell: ShellService, sid: str
) -> None:
    # the next copy moves its descriptors into place under the limit the state restores
    assert shell.run("ulimit -n 32", session_id=sid).success
    res = shell.run("echo ok; ulimit -n", session_id=sid)
    assert res.stdout == "ok\n32\n", res


def test_a_session_without_the_builtins_bytes_falls_back(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # a session on an image takes the builtin from the bytes the fork server preloaded; an
    # interpreter without them (not from that fork server) gets a bash per command instead
    monkeypatch.setattr(_native, "BUILTIN", None)
    live = _native.Live("", {"PATH": "/usr/bin:/bin"})
    with pytest.raises(_native.Unavailable):
        live.prime(b"", 0)
    assert live.root is None
