"""The live bash: commands run in copies of one bash that holds the state (issue 22).

Where the package carries its bash builtin (built with a C compiler), each
command is a copy of the session's master bash; without it (no compiler,
``TOOLSERVICES_SHELL_NATIVE=0``, an image, a bash that cannot load it) a fresh
bash per command, as before. Both ways keep the same guarantees: the rest of
tests/shell runs against whichever this checkout has (``.ci/run`` runs it
both ways).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from toolservices.shell import ShellService, _command, _native, _service

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


# A state change of each kind the save covers, and a command that shows it in the next copy:
# the copy compares its state's fingerprint with its master's and saves only on a change.
_CHANGES = [
    ("A=1", 'echo "$A"', "1"),
    ("A=2", 'echo "$A"', "2"),
    ("f() { echo f; }", "f", "f"),
    ("unset -f f; f() { echo g; }", "f", "g"),  # same size, maybe the same address
    ("declare -a X=(1 2)", 'echo "${X[*]}"', "1 2"),
    ("X[1]=3", 'echo "${X[*]}"', "1 3"),
    ("declare -A M=([k]=v)", 'echo "${M[k]}"', "v"),
    ("M[k]=w", 'echo "${M[k]}"', "w"),
    ("shopt -s expand_aliases; alias ll=ls", "alias ll", "alias ll='ls'"),
    ("alias ll='ls -l'", "alias ll", "alias ll='ls -l'"),
    ("cd /tmp", "pwd", "/tmp"),
    ("ulimit -S -n 100", "ulimit -S -n", "100"),
    ("set -o noglob", "echo *", "*"),
    ("declare -i N=5; N+=1", "echo $N", "6"),
    ("export E=1", "printenv E", "1"),
    ("export -n E", 'printenv E || echo "$E"', "1"),
    ("unset A", 'echo "${A-unset}"', "unset"),
]


def test_every_kind_of_state_change_reaches_the_next_command(shell: ShellService, sid: str) -> None:
    for change, show, expected in _CHANGES:
        assert shell.run(change, session_id=sid).success, change
        for _ in range(2):  # the copy after the change, and one from the master it made
            res = shell.run(show, session_id=sid)
            assert res.stdout == expected + "\n" and not res.restarted, (change, res)


_SCRIPT = r"""
import base64, json, os, sys, tempfile
from toolservices.shell import _command, _native, _supervisor

os.chdir(tempfile.mkdtemp())
shell = _supervisor.Shell(os.getcwd(), max_output=4096, max_file=4096, native=_native.library())
saved = []
take = shell._take_state
shell._take_state = lambda text: saved.append(text == _command.SAME) or take(text)
out = []
for command in sys.argv[1:]:
    reply = shell.run(command, 10.0, None)
    answered_first = shell.saving is not None
    if "gate" in command:  # its copy waits in its save (see the test): let it go now
        with open("gate", "w") as gate:
            gate.write("go\n")
    shell.after_reply()
    out.append([base64.b64decode(reply["stdout"]).decode(), reply["returncode"],
                reply["restarted"], answered_first, saved[-1], shell.generation])
shell.live.close()
print(json.dumps(out))
"""


def _on_this_host(*commands: str) -> list[list[object]]:
    """Run ``commands`` in a supervisor on this host (a subprocess: it makes its process
    non-dumpable); per command its stdout, status, restarted, whether it answered before
    its bash exited, whether its bash saved nothing, and the state's generation."""
    proc = subprocess.run(
        [sys.executable, "-c", _SCRIPT, *commands], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    rows: list[list[object]] = json.loads(proc.stdout)
    return rows


@needs_builtin
def test_a_copy_saves_only_a_changed_state() -> None:
    # (the first two commands save: the state a master reads back is the one that settles)
    rows = _on_this_host(
        "echo a", "echo b", "echo c", "X=1", "echo $X", "exit 3", "kill $$", "echo $X"
    )
    echo, change, shown, exited, killed, after = rows[2:]
    assert echo[:3] == ["c\n", 0, False] and echo[4] is True
    assert change[4] is False and change[5] == echo[5] + 1
    assert shown[:3] == ["1\n", 0, False] and shown[4] is True
    assert exited[:3] == ["", 3, False] and exited[4] is True
    # dying of a signal, bash runs its EXIT trap first: only waitpid knows the status
    assert killed[:4] == ["", -15, False, False]
    assert after[:3] == ["1\n", 0, False]


def test_collect_returns_on_the_answer_while_bash_still_runs() -> None:
    # what a copy's `__ts_serve done` writes (the status, 4 bytes on fd 6), by a bash that
    # then waits on its stdin: collect answers without waiting for its exit
    done_r, done_w = os.pipe2(os.O_CLOEXEC)
    out_r, out_w = os.pipe2(os.O_CLOEXEC)
    err_r, err_w = os.pipe2(os.O_CLOEXEC)
    in_r, in_w = os.pipe2(os.O_CLOEXEC)
    script = f"echo out; printf '\\003\\000\\000\\000' >&{done_w}; read -r _; true"
    bash = subprocess.Popen(
        ["bash", "-c", script], stdin=in_r, stdout=out_w, stderr=err_w, pass_fds=(done_w,)
    )
    for fd in (in_r, out_w, err_w, done_w):
        os.close(fd)
    pidfd = os.pidfd_open(bash.pid)
    try:
        status, outs, timed_out, stuck, answered = _command.collect(
            bash.pid, out_r, err_r, {}, 10.0, 4096, pidfd=pidfd, done_r=done_r
        )
        assert answered and os.WEXITSTATUS(status) == 3 and bash.poll() is None
        assert outs[0][0] == b"out\n" and not timed_out and not stuck
    finally:
        os.close(in_w)  # its read ends: it exits
        assert bash.wait(timeout=10) == 0
        for fd in (pidfd, out_r, err_r, done_r):
            os.close(fd)


@needs_builtin
def test_a_command_cannot_answer_for_its_bash(shell: ShellService, sid: str) -> None:
    # the descriptor a copy answers on is out of reach of the command's redirections
    res = shell.run(
        "echo forged >&6; (exec 0>&6) 2>/dev/null || echo closed; echo real", session_id=sid
    )
    assert res.stdout == "closed\nreal\n" and res.returncode == 0, res
    assert "Bad file descriptor" in res.stderr, res


@needs_builtin
@pytest.mark.parametrize("breaks", ["exec 4>four", "exec 4>&-", "ulimit -f 0"])
def test_a_command_that_stops_its_save_says_restarted_at_once(
    shell: ShellService, sid: str, breaks: str
) -> None:
    # the copy does not answer before a save bound to fail (fd 4 not the state's memfd any
    # more, a lowered file size limit: bash dies of SIGXFSZ writing it): the command's own
    # result says so; no file of the command gets the state
    assert shell.run("X=1", session_id=sid).success
    res = shell.run(f"{breaks}; X=2", session_id=sid)
    assert res.restarted and not res.timed_out, res
    after = shell.run('cat four 2>/dev/null | wc -c; echo "$X"', session_id=sid)
    assert after.stdout == "0\n1\n" and not after.restarted, after


@needs_builtin
def test_the_answers_descriptor_taken_by_a_command_gets_nothing(
    shell: ShellService, sid: str
) -> None:
    for fd in range(100, 104):  # where the answer's descriptor goes (the first free above 99)
        assert shell.run(f"exec {fd}>f{fd}; Y={fd}", session_id=sid).success
        res = shell.run(f'wc -c <f{fd}; echo "$Y"', session_id=sid)
        assert res.stdout == f"0\n{fd}\n" and not res.restarted, res
