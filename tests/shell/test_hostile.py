"""A hostile corpus for the shell: each case gets the safe outcome, and a fresh session works after.

Every command is bounded (short timeouts, capped loops, small quotas), so it
cannot harm the machine even if an isolation layer were missing. Cases run
against one service with lowered limits; after each one an autouse fixture
checks that a brand-new session still answers.
"""

from __future__ import annotations

import os
import socket
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest

from toolservices.errors import InfrastructureError
from toolservices.python import SandboxConfig
from toolservices.shell import ShellFileError, ShellResult, ShellService

SECRET = f"TS-HOST-SECRET-{uuid.uuid4().hex}"
SECRET_ENV = "TS_SHELL_TEST_SECRET"
PY = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable
QUOTA = 32 << 20


@pytest.fixture(scope="module")
def secret_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("host") / "secret.txt"
    path.write_text(SECRET)
    return path


@pytest.fixture(scope="module")
def shell(secret_file: Path) -> Iterator[ShellService]:
    """Started with a secret in the caller's environment, which sessions must never see."""
    os.environ[SECRET_ENV] = SECRET
    svc = ShellService(
        pool_size=2,
        timeout=8.0,
        max_output=32 * 1024,
        max_file_size=1 << 20,
        max_sessions=64,
        disk_quota=QUOTA,
        sandbox=SandboxConfig(memory_limit=1 << 30, nproc=32),
    )
    try:
        svc.run("true")  # the fork server starts with the secret in our environment
        yield svc
    finally:
        os.environ.pop(SECRET_ENV, None)
        svc.close()


@pytest.fixture(autouse=True)
def fresh_session_works_after(shell: ShellService) -> Iterator[None]:
    yield
    sid = f"after-{uuid.uuid4().hex[:8]}"
    res = shell.run("echo ok; ls -A | wc -l", session_id=sid, timeout=8)
    assert res.stdout == "ok\n0\n", res
    assert shell.close_session(sid)


def new_sid() -> str:
    return f"h-{uuid.uuid4().hex[:8]}"


def marker() -> str:
    return f"TSMARK{uuid.uuid4().hex[:12]}"


def alive_with(mark: str) -> list[psutil.Process]:
    found = []
    for proc in psutil.process_iter(["cmdline", "status"]):
        try:
            if any(mark in part for part in proc.info["cmdline"] or []) and (
                proc.info["status"] != psutil.STATUS_ZOMBIE
            ):
                found.append(proc)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return found


def alive_probe(mark: str) -> str:
    """A command printing "alive" once a process marked ``mark`` runs in the session.

    A job started with ``&`` is forked at once but carries its mark only after its
    ``exec``: wait for that (bounded, 5 s) rather than race it.
    """
    wait = f"for _ in $(seq 500); do pgrep -f {mark} >/dev/null && break; sleep 0.01; done"
    return f"{wait}; pgrep -f {mark} >/dev/null && echo alive"


def gone_within(mark: str, seconds: float = 5.0) -> bool:
    _gone, alive = psutil.wait_procs(alive_with(mark), timeout=seconds)
    return not [p for p in alive if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]


# --- commands with the outcome they must get ------------------------------------------------


@dataclass(frozen=True)
class Case:
    command: str
    check: Callable[[ShellResult], bool]
    timeout: float = 5.0
    stdin: str | None = None
    #: the command leaves its own session unable to start anything (a live fork bomb):
    #: the next command must then say so clearly instead of working
    exhausts_session: bool = False


def fails(res: ShellResult) -> bool:
    return not res.success and SECRET not in res.stdout + res.stderr


def no_secret(res: ShellResult) -> bool:
    return SECRET not in res.stdout + res.stderr


def disk_full(res: ShellResult) -> bool:
    """Stopped by the size cap of the mount (ENOSPC) or of one file (EFBIG), whichever is lower."""
    return any(
        text in res.stderr
        for text in ("No space left on device", "File too large", "File size limit exceeded")
    )


def waited_for_keys(res: ShellResult) -> bool:
    """Stopped for waiting on a terminal: not a timeout, and the message says why and what to do."""
    return (
        not res.timed_out
        and not res.success
        and "was waiting for keys from a terminal" in res.stderr
        and "write_file" in res.stderr
    )


def clean_end(res: ShellResult) -> bool:
    """A clear result: it ended by itself (no hang) and said something or failed."""
    return not res.timed_out and res.duration < 4.0


CASES: dict[str, Case] = {
    # host secrets and the parent's environment
    "env-has-no-parent-secret": Case(
        "env", lambda r: r.success and no_secret(r) and SECRET_ENV not in r.stdout
    ),
    "proc-environ-of-all": Case("cat /proc/*/environ 2>/dev/null | tr '\\0' '\\n'", no_secret),
    "proc-1-environ": Case("cat /proc/1/environ", no_secret),
    "root-home": Case("ls -la /root 2>&1; cat /root/.bash_history 2>&1", no_secret),
    "etc-shadow": Case("cat /etc/shadow", fails),
    "etc-passwd-host": Case("cat /etc/passwd", lambda r: no_secret(r)),
    "grep-everywhere": Case(
        f"grep -rs {SECRET[:20]} /usr/local /tmp /sandbox /etc 2>/dev/null | head", no_secret
    ),
    "ssh-keys": Case("ls /root/.ssh /home/*/.ssh 2>&1; cat /etc/ssh/ssh_host_*_key 2>&1", fails),
    # the network
    "tcp-outside": Case("exec 3<>/dev/tcp/1.1.1.1/80", fails, timeout=5),
    "udp-outside": Case("echo x > /dev/udp/8.8.8.8/53", fails),
    "dns": Case(f"{PY} -c 'import socket; socket.getaddrinfo(\"example.com\", 80)'", fails),
    "python-socket": Case(
        f"{PY} -c 'import socket; socket.create_connection((\"1.1.1.1\", 53), timeout=2)'", fails
    ),
    "curl": Case("curl -sS -m 2 http://example.com", fails),
    "only-loopback": Case(
        "cat /proc/net/dev", lambda r: "eth" not in r.stdout and "ens" not in r.stdout
    ),
    # fork bombs and process budgets
    # the bomb returns at once and runs on in the background, inside the session's budget
    "fork-bomb": Case(":(){ :|:& };:", no_secret, timeout=3, exhausts_session=True),
    "fork-bomb-waited": Case(":(){ :|:& };:; wait; sleep 5", lambda r: r.timed_out, timeout=2),
    # more sleepers than a shell session's process budget (SHELL_NPROC, 256)
    "many-sleepers": Case(
        "for i in $(seq 300); do sleep 3 & done 2>&1 | tail -1; wait",
        lambda r: "fork: " in r.stdout + r.stderr or not r.success,
        timeout=4,
    ),
    "thread-bomb": Case(
        f"{PY} -c 'import threading,time\n"
        "for i in range(500): threading.Thread(target=time.sleep, args=(2,)).start()'",
        lambda r: not r.success and "can't start new thread" in r.stderr,
    ),
    # RLIMIT_AS (MemoryError) without a memory cgroup; with one, the kernel kills it
    "memory-bomb": Case(
        f"{PY} -c 'x = bytearray(3 << 30)'",
        lambda r: "MemoryError" in r.stderr or r.returncode in (137, -9),
    ),
    "cpu-spin": Case(
        "while :; do :; done", lambda r: r.timed_out and r.returncode == -1, timeout=1
    ),
    "ignore-term": Case("trap '' TERM INT HUP; sleep 30", lambda r: r.timed_out, timeout=1),
    "open-files": Case(
        "for i in $(seq 400); do exec {fd}</dev/null || { echo stopped at $i; break; }; done",
        lambda r: "stopped at" in r.stdout,
    ),
    # disk
    "disk-fill-workspace": Case(
        "head -c 64M /dev/zero > big; echo rc=$?",
        lambda r: "No space left on device" in r.stderr and "rc=1" in r.stdout,
    ),
    "disk-fill-many-files": Case(
        "for i in $(seq 64); do head -c 1M /dev/zero > f$i || break; done; ls | wc -l",
        lambda r: "No space left on device" in r.stderr,
    ),
    "disk-fill-tmp": Case("head -c 128M /dev/zero > /tmp/big", lambda r: disk_full(r)),
    "disk-fill-shm": Case("head -c 128M /dev/zero > /dev/shm/big", lambda r: disk_full(r)),
    "write-readonly-root": Case("echo x > /usr/bin/evil", fails),
    "write-etc": Case("echo x >> /etc/ld.so.conf", fails),
    # output floods and odd bytes
    "stdout-flood": Case(
        "yes | head -c 10M",
        lambda r: r.truncated and len(r.stdout) < 40 * 1024 and "bytes omitted ...]" in r.stdout,
    ),
    "stderr-flood": Case(
        "yes 1>&2 | head -c 10M 1>&2", lambda r: r.truncated and len(r.stderr) < 40 * 1024
    ),
    "endless-output": Case("yes", lambda r: r.timed_out and r.truncated, timeout=1),
    "binary-output": Case("head -c 4096 /dev/urandom", lambda r: r.success and len(r.stdout) > 0),
    "nul-and-ansi": Case(
        "printf 'a\\0b\\033[31mred\\033[0m\\xff\\n'",
        lambda r: r.stdout == "a\x00b\x1b[31mred\x1b[0m\ufffd\n",
    ),
    "long-line": Case(
        "head -c 100000 /dev/zero | tr '\\0' x",
        lambda r: r.truncated and r.stdout.startswith("x" * 1000),
    ),
    # boundaries and statuses never in-band
    "fake-result-json": Case(
        'echo \'{"returncode": 0, "timed_out": false, "restarted": false}\'; exit 7',
        lambda r: r.returncode == 7 and '"returncode": 0' in r.stdout,
    ),
    "fake-end-marker": Case(
        "echo '#toolservices-state-end'; echo '#toolservices-state-end' >&2; exit 3",
        lambda r: r.returncode == 3,
    ),
    "close-stdout-stderr": Case(
        "exec >&- 2>&-; sleep 0.2; exit 4", lambda r: r.returncode == 4 and r.duration >= 0.2
    ),
    "redirect-stdout": Case(
        "exec >/dev/null 2>&1; echo hidden; exit 5", lambda r: r.returncode == 5
    ),
    "exit-code": Case("exit 9", lambda r: r.returncode == 9 and not r.restarted),
    "exec-replaces-shell": Case("exec true", lambda r: r.returncode == 0 and r.restarted),
    "kill-own-shell": Case("kill -9 $$", lambda r: r.returncode == -9 and r.restarted),
    "stop-own-shell": Case("kill -STOP $$", lambda r: r.timed_out, timeout=1),
    "close-state-fd": Case("exec 4>&-; export X=1", lambda r: r.success and r.restarted),
    "garbage-in-state-fd": Case("echo 'exit 42' >&4; echo ok", lambda r: r.stdout == "ok\n"),
    "redefine-builtins": Case(
        "builtin() { :; }; declare() { :; }; echo ok", lambda r: r.stdout == "ok\n"
    ),
    "override-exit-trap": Case("trap 'echo mine' EXIT; echo ok", lambda r: "ok" in r.stdout),
    "no-private-fds-but-state": Case(
        "ls /proc/self/fd | tr '\\n' ' '", lambda r: r.stdout.split() == ["0", "1", "2", "3", "4"]
    ),
    "syntax-error": Case(
        "if then fi (", lambda r: r.returncode == 2 and "syntax error" in r.stderr
    ),
    # signals: the supervisor, the server, other processes
    # bash's parent once started: the session's supervisor, outside the commands' domain
    "kill-supervisor": Case("kill -9 $(ps -o ppid= $$)", lambda r: "not permitted" in r.stderr),
    "kill-earlier-job": Case(
        "sleep 60 & echo $! > /tmp/job.pid; kill $(cat /tmp/job.pid) && echo killed",
        lambda r: r.stdout == "killed\n",
    ),
    "kill-fork-server": Case("kill -9 1 2 2>&1", lambda r: "not permitted" in r.stdout),
    "kill-everything": Case("kill -9 -1; echo survived", lambda r: r.returncode == -9 or r.success),
    # pkill -f also matches this very shell (its argv holds the command): -9 or done
    "pkill-python": Case(
        "pkill -9 python; pkill -9 -f forkserver; echo done",
        lambda r: r.returncode == -9 or "done" in r.stdout,
    ),
    "ptrace": Case("strace -f true", fails),
    # privileges, setuid, namespaces
    "setuid-su": Case("su -c id root", fails, stdin=None),
    "setuid-mount": Case("mount -t tmpfs none /tmp", fails),
    "setuid-passwd": Case("passwd -S root", lambda r: no_secret(r)),
    "sudo": Case("sudo id", fails),
    "unshare-user": Case("unshare -r id", fails),
    "nsenter": Case("nsenter -t 1 -m id", fails),
    "uid-is-unprivileged": Case("id -u", lambda r: r.stdout.strip() not in ("0", "")),
    "own-setuid-bit": Case(
        f"cp {PY} ./p && chmod u+s ./p && ./p -c 'import os; print(os.geteuid())'",
        lambda r: r.stdout.strip() != "0",
    ),
    "no-new-privs": Case(
        "grep NoNewPrivs /proc/self/status", lambda r: r.stdout.split()[-1] == "1"
    ),
    "caps-none": Case(
        "grep CapEff /proc/self/status", lambda r: r.stdout.split()[-1] == "0000000000000000"
    ),
    # TTYs and stdin
    # full-screen editors would wait for keys that never come: stopped well before the limit
    "vi": Case("vi x.txt", waited_for_keys, timeout=60),
    "vim-no-file": Case("vim", waited_for_keys, timeout=60),
    "view-piped": Case("echo a | view -", lambda r: not r.timed_out, timeout=60),
    "vi-in-subshell": Case("(cd /tmp && vi y)", waited_for_keys, timeout=60),
    # stdin turned into a write-only descriptor, but not waiting for it: left alone
    "stdin-write-only": Case(
        "sleep 1.5 0>&2; echo slept", lambda r: r.success and r.stdout == "slept\n", timeout=60
    ),
    "ssh-password": Case(
        "ssh -o StrictHostKeyChecking=no -o BatchMode=no nobody@127.0.0.1", clean_end
    ),
    "vim-ex": Case("vim -es -c 'q!'", clean_end, timeout=5),
    "python-repl": Case(PY, lambda r: r.success and clean_end(r)),
    "less": Case("echo page | less", lambda r: r.stdout == "page\n"),
    "top": Case("top", lambda r: clean_end(r) and not r.success),
    "dev-tty": Case("cat /dev/tty", lambda r: clean_end(r) and not r.success),
    "read-stdin": Case('read -r x; echo "[$x] $?"', lambda r: r.stdout == "[] 1\n"),
    "cat-stdin": Case("cat; echo end", lambda r: r.stdout == "end\n"),
    "stdin-given": Case(
        'read -r x; echo "[$x]"', lambda r: r.stdout == "[hello]\n", stdin="hello\n"
    ),
    "stdin-closed-early": Case("head -c 1", lambda r: r.stdout == "y", stdin="y" * 1_000_000),
    "nul-in-command": Case("echo a\x00b", lambda r: r.returncode == 2 and "NUL" in r.stderr),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_hostile_command(shell: ShellService, name: str) -> None:
    case = CASES[name]
    sid = new_sid()
    res = shell.run(case.command, session_id=sid, timeout=case.timeout, stdin=case.stdin)
    assert case.check(res), res
    # the same session still answers, whatever the command did to its shell
    again = shell.run("echo next", session_id=sid, timeout=8)
    if case.exhausts_session and again.returncode == 126:
        assert "cannot start the command" in again.stderr, again
    elif case.exhausts_session and again.timed_out:
        # 256 bombing tasks (the shell's budget) can starve it on a small machine: it
        # still answers, within its limit, and the session closes with the bomb
        assert again.restarted, again
    else:
        assert again.stdout == "next\n", again
    assert shell.close_session(sid)


# --- file tools: never more rights than the session's own commands ----------------------------


def test_file_tools_cannot_read_host_secret(shell: ShellService, secret_file: Path) -> None:
    sid = new_sid()
    for path in (str(secret_file), "/etc/shadow", "/root/.bashrc", "/proc/1/environ"):
        try:
            data = shell.read_file(path, session_id=sid)
        except ShellFileError as exc:
            assert exc.reason in ("ENOENT", "EACCES", "EPERM"), exc
        else:
            assert SECRET not in data
    shell.close_session(sid)


@pytest.mark.parametrize("target", ["/etc/shadow", "SECRET", "/proc/1/environ", "/root"])
def test_planted_symlink_gives_no_more_than_the_shell(
    shell: ShellService, secret_file: Path, target: str
) -> None:
    sid = new_sid()
    target = str(secret_file) if target == "SECRET" else target
    shell.run(f"ln -s {target} link", session_id=sid)
    cat = shell.run("cat link", session_id=sid)
    try:
        data = shell.read_file("link", session_id=sid)
    except ShellFileError:
        assert not cat.success
    else:
        assert cat.success and SECRET not in data
    with pytest.raises(ShellFileError):
        shell.write_file("link", "x", session_id=sid)
    shell.close_session(sid)


@pytest.mark.parametrize(
    "path",
    ["../../../../etc/shadow", "../../..", "/usr/bin/evil", "/etc/passwd", "/proc/1/mem", "/sys/x"],
)
def test_write_outside_the_workspace_is_refused(shell: ShellService, path: str) -> None:
    sid = new_sid()
    with pytest.raises(ShellFileError):
        shell.write_file(path, "x", session_id=sid)
    shell.close_session(sid)


def test_dotdot_stays_in_the_sessions_own_disk(shell: ShellService) -> None:
    """``..`` from the workspace reaches the session's own quota'd directory or the sandbox's
    read-only root (with a fixed workspace path), never the host's."""
    sid, other = new_sid(), new_sid()
    fixed = shell.isolation_report().get("workspace")
    if fixed is not None:  # the parent of /workspace is the read-only root
        with pytest.raises(ShellFileError) as info:
            shell.write_file("../escape.txt", "mine", session_id=sid)
        assert info.value.reason in ("EACCES", "EROFS", "EPERM")
        assert not shell.run("echo x > ../escape.txt", session_id=sid).success
    else:
        shell.write_file("../escape.txt", "mine", session_id=sid)
        assert shell.read_file("../escape.txt", session_id=sid) == "mine"
        with pytest.raises(ShellFileError):
            shell.read_file("../escape.txt", session_id=other)
        base = os.path.dirname(os.path.dirname(shell.workspace(sid)))
        assert not any(p.name == "escape.txt" for p in Path("/").glob(base.lstrip("/") + "/*/*"))
    shell.close_session(sid)
    shell.close_session(other)


def test_other_sessions_workspace_is_closed(shell: ShellService) -> None:
    a, b = new_sid(), new_sid()
    shell.write_file("mine.txt", "A", session_id=a)
    where = shell.workspace(a)
    # with a fixed workspace path it names b's own workspace: a's is in a's mount namespace
    for path in (f"{where}/mine.txt", f"/proc/1/root{where}/mine.txt"):
        with pytest.raises(ShellFileError):
            shell.read_file(path, session_id=b)
    if where != shell.workspace(b):
        with pytest.raises(ShellFileError):
            shell.write_file(f"{where}/mine.txt", "B", session_id=b)
        with pytest.raises(ShellFileError):
            shell.list_files(where, session_id=b)
    probe = f"cat {where}/mine.txt /proc/[0-9]*/root{where}/mine.txt /proc/[0-9]*/cwd/mine.txt"
    assert "A" not in shell.run(f"{probe} 2>/dev/null", session_id=b).stdout
    shell.run(f"ln -s {where}/mine.txt l", session_id=b)
    with pytest.raises(ShellFileError):
        shell.read_file("l", session_id=b)
    assert shell.read_file("mine.txt", session_id=a) == "A"
    shell.close_session(a)
    shell.close_session(b)


def test_hard_links_cannot_reach_outside(shell: ShellService, secret_file: Path) -> None:
    sid = new_sid()
    res = shell.run(
        f"ln {secret_file} h1; ln /usr/bin/env h2; ln /etc/ld.so.cache h3", session_id=sid
    )
    assert not res.success
    assert shell.list_files(session_id=sid) == []
    shell.close_session(sid)


def test_symlink_swapped_between_check_and_use(shell: ShellService, secret_file: Path) -> None:
    """A loop flips ``x`` between a file and a symlink to the secret while read_file reads it."""
    sid = new_sid()
    shell.run(
        f"echo plain > plain; (for i in $(seq 20000); do ln -sfn {secret_file} x; ln -sfn plain x;"
        " ln -sfn /etc/shadow x; done) >/dev/null 2>&1 &",
        session_id=sid,
    )
    seen = set()
    for _ in range(40):
        try:
            data = shell.read_file("x", session_id=sid)
        except ShellFileError as exc:
            seen.add(exc.reason)
            continue
        assert SECRET not in data
        seen.add(data)
    assert seen
    shell.close_session(sid)


def test_special_files_do_not_hang_file_tools(shell: ShellService) -> None:
    sid = new_sid()
    shell.run("mkfifo pipe; mkdir d", session_id=sid)
    for path, reason in (("pipe", "ENOTREG"), ("d", "EISDIR"), ("/dev/zero", "ENOTREG")):
        with pytest.raises(ShellFileError) as info:
            shell.read_file(path, session_id=sid)
        assert info.value.reason == reason
    with pytest.raises(ShellFileError) as info:
        shell.write_file("d", "x", session_id=sid)
    assert info.value.reason == "EISDIR"
    shell.close_session(sid)


def test_file_size_caps_are_clear(shell: ShellService) -> None:
    sid = new_sid()
    with pytest.raises(ShellFileError) as info:
        shell.write_file("big", b"x" * ((1 << 20) + 1), session_id=sid)
    assert info.value.reason == "EFBIG" and "limit" in str(info.value)
    shell.run("truncate -s 2M sparse", session_id=sid)
    with pytest.raises(ShellFileError) as info:
        shell.read_file("sparse", session_id=sid)
    assert info.value.reason == "EFBIG"
    shell.close_session(sid)


def test_write_file_fills_the_quota_with_enospc(shell: ShellService) -> None:
    sid = new_sid()
    with pytest.raises(ShellFileError) as info:
        for i in range(64):
            shell.write_file(f"f{i}", b"\0" * (1 << 20), session_id=sid)
    assert info.value.reason in ("ENOSPC", "EFBIG")
    assert shell.run("rm f*; echo freed", session_id=sid).stdout == "freed\n"
    shell.write_file("again", "ok", session_id=sid)
    shell.close_session(sid)


# --- processes: what outlives what ----------------------------------------------------------------


@pytest.mark.parametrize(
    "start",
    [
        "exec -a {m} sleep 300 &",
        "nohup bash -c 'exec -a {m} sleep 300' >/dev/null 2>&1 &",
        "( ( exec -a {m} sleep 300 & ) & )",
        "setsid bash -c 'exec -a {m} sleep 300' &",
        "disown_me() {{ exec -a {m} sleep 300; }}; disown_me & disown",
    ],
    ids=["background", "nohup", "double-fork", "setsid", "disown"],
)
def test_close_session_kills_every_process(shell: ShellService, start: str) -> None:
    sid, mark = new_sid(), marker()
    assert shell.run(start.format(m=mark), session_id=sid).success
    assert shell.run(alive_probe(mark), session_id=sid).stdout == "alive\n"
    assert alive_with(mark)
    assert shell.close_session(sid)
    assert gone_within(mark)


def test_background_job_survives_calls_and_other_timeouts(shell: ShellService) -> None:
    sid, mark = new_sid(), marker()
    shell.run(f"exec -a {mark} sleep 300 &", session_id=sid)
    res = shell.run("sleep 30", session_id=sid, timeout=0.5)
    assert res.timed_out
    assert shell.run(alive_probe(mark), session_id=sid).stdout == "alive\n"
    shell.close_session(sid)
    assert gone_within(mark)


def test_job_started_after_the_next_spare_is_not_killed_by_the_next_timeout(
    shell: ShellService,
) -> None:
    # The next command's bash is started while this command runs; a job this command puts
    # in the background after that (a higher pid, a later start) is still this command's.
    # (A bash leading its own process group other than this command's: the next spare.)
    sid, mark = new_sid(), marker()
    spare = "ps -eo pid=,pgid=,comm= | awk -v me=$me '$3 == \"bash\" && $1 == $2 && $1 != me'"
    shell.run(
        f'me=$$; ( for _ in $(seq 500); do [ -n "$({spare})" ] && break; sleep 0.01; done; '
        f"exec -a {mark} sleep 300 & ) >/dev/null 2>&1 &",
        session_id=sid,
    )
    wait = f"for _ in $(seq 500); do pgrep -f {mark} >/dev/null && break; sleep 0.01; done"
    assert shell.run(f"{wait}; sleep 30", session_id=sid, timeout=3).timed_out
    probe = shell.run(alive_probe(mark), session_id=sid)
    assert probe.stdout == "alive\n"
    shell.close_session(sid)
    assert gone_within(mark)


def test_a_double_fork_of_an_earlier_job_is_not_killed_by_a_later_timeout(
    shell: ShellService,
) -> None:
    # the earlier job forks its orphan while the later command runs: a younger process than
    # that command's bash, reparented to the supervisor, but of the earlier job's group
    sid, mark = new_sid(), marker()
    shell.run(f"( sleep 0.2; ( exec -a {mark} sleep 300 & ) ) &", session_id=sid)
    wait = f"for _ in $(seq 500); do pgrep -f {mark} >/dev/null && break; sleep 0.01; done"
    assert shell.run(f"{wait}; sleep 30", session_id=sid, timeout=3).timed_out
    assert shell.run(alive_probe(mark), session_id=sid).stdout == "alive\n"
    shell.close_session(sid)
    assert gone_within(mark)


def test_timeout_kills_the_jobs_its_command_started(shell: ShellService) -> None:
    sid, mark = new_sid(), marker()
    res = shell.run(
        f"setsid bash -c 'exec -a {mark} sleep 300' & ( exec -a {mark} sleep 300 & ); sleep 30",
        session_id=sid,
        timeout=0.5,
    )
    assert res.timed_out
    assert gone_within(mark)
    assert shell.run("echo fine", session_id=sid).stdout == "fine\n"
    shell.close_session(sid)


def test_cannot_signal_or_inspect_another_session(shell: ShellService) -> None:
    a, b, mark = new_sid(), new_sid(), marker()
    shell.run(f"export A_ONLY={SECRET}; exec -a {mark} sleep 300 &", session_id=a)
    assert shell.run(alive_probe(mark), session_id=a).stdout == "alive\n"  # b sees it to try
    res = shell.run(
        f"for p in $(pgrep -f {mark}); do kill -9 $p; cat /proc/$p/environ; ls /proc/$p/cwd/; "
        "ls /proc/$p/root/; done; pkill -9 -f " + mark + "; kill -9 -1; echo done",
        session_id=b,
    )
    assert SECRET not in res.stdout + res.stderr
    assert shell.run(alive_probe(mark), session_id=a).stdout == "alive\n"
    shell.close_session(a)
    shell.close_session(b)


def test_host_listener_is_unreachable(shell: ShellService) -> None:
    server = socket.create_server(("127.0.0.1", 0))
    server.settimeout(0.5)
    port = server.getsockname()[1]
    accepted: list[object] = []

    def accept() -> None:
        try:
            accepted.append(server.accept())
        except OSError:
            pass

    thread = threading.Thread(target=accept)
    thread.start()
    try:
        res = shell.run(f"exec 3<>/dev/tcp/127.0.0.1/{port} && echo connected", timeout=3)
        assert "connected" not in res.stdout
    finally:
        thread.join()
        server.close()
    assert not accepted


def test_close_session_frees_the_disk(shell: ShellService) -> None:
    sid = new_sid()
    assert shell.run("head -c 20M /dev/zero > big && echo ok", session_id=sid).stdout == "ok\n"
    shell.close_session(sid)
    again = shell.run("ls", session_id=sid)
    assert again.stdout == ""


def test_stopped_spare_shell_cannot_hang_the_session(shell: ShellService) -> None:
    """A background job stops the bash waiting for the next command (it restored the state)."""
    sid = new_sid()
    shell.run("echo kept > f; BIG=$(head -c 200000 /dev/zero | tr '\\0' x)", session_id=sid)
    # the spare is started when a command ends: a job of this one waits for it. The spare is
    # the bash whose parent is the supervisor (our own parent), other than us and the job.
    stop = (
        "sup=$(ps -o ppid= $$ | tr -d ' '); me=$$; "
        "(job=$BASHPID; until spare=$(ps -eo pid=,ppid=,comm= | "
        "awk -v s=$sup -v me=$me -v job=$job "
        "'$2 == s && $3 == \"bash\" && $1 != me && $1 != job {print $1}'); "
        '[ -n "$spare" ]; do sleep 0.01; done; kill -STOP $spare && echo "$spare" > stopped) '
        ">/dev/null 2>&1 &"
    )
    assert shell.run(stop, session_id=sid).success
    # the file tools run in the supervisor, not in a bash: they see the job's mark
    for _ in range(1000):  # bounded: 10 s
        try:
            shell.read_file("stopped", session_id=sid)
            break
        except ShellFileError:
            time.sleep(0.01)
    else:
        raise AssertionError("the job never found the spare bash")
    # With the live bash the job may have found the master (a copy of the root, also the
    # supervisor's child) before the copy made ahead for this command: then this command
    # runs in that copy; else it is the stopped one and times out. Never a hang or a loss.
    res = shell.run("echo never", session_id=sid, timeout=1)
    assert res.timed_out or res.stdout == "never\n", res
    assert "did not answer" not in res.stderr, res
    after = shell.run('echo "${#BIG}"; cat f', session_id=sid)
    assert after.stdout == "200000\nkept\n", after
    shell.close_session(sid)


def test_stopped_spawner_is_replaced(shell: ShellService) -> None:
    """A command stops every other process it can reach (the spawner too): the session goes on."""
    sid = new_sid()
    shell.run("echo kept > f", session_id=sid)
    res = shell.run(
        "pkill -STOP python; pkill -STOP -x bash -P 1 2>/dev/null; echo sent", session_id=sid
    )
    assert "sent" in res.stdout or res.returncode < 0, res
    for _ in range(2):  # the second one needs a bash from the stopped spawner
        after = shell.run("cat f", session_id=sid, timeout=8)
        assert after.stdout == "kept\n", after
    shell.close_session(sid)


# --- issue 24: what sessions share (one uid) --------------------------------------------------

#: every same-uid process call the kernel allows on any pid it can name: lower its limits,
#: priority, scheduling policy, CPUs and I/O class. Skips only itself and its own parent.
_ATTACK_PIDS = r"""
import ctypes, os, resource
libc = ctypes.CDLL(None, use_errno=True)
mine = {os.getpid(), os.getppid(), 1}
hit = 0
for pid in range(1, 1 << 17):
    if pid in mine:
        continue
    done = False
    for call in (
        lambda: resource.prlimit(pid, resource.RLIMIT_NOFILE, (8, 8)),
        lambda: os.setpriority(os.PRIO_PROCESS, pid, 19),
        lambda: os.sched_setscheduler(pid, os.SCHED_IDLE, os.sched_param(0)),
        lambda: os.sched_setaffinity(pid, {0}),
    ):
        try:
            call()
            done = True
        except OSError:
            pass
    if libc.syscall(251, 1, pid, (3 << 13) | 7) == 0:  # ioprio_set(WHO_PROCESS, pid, IDLE)
        done = True
    hit += done
print("hit", hit)
"""


def test_other_sessions_and_the_fork_server_are_invisible(shell: ShellService) -> None:
    a, b, mark = new_sid(), new_sid(), marker()
    shell.run(f"exec -a {mark} sleep 300 &", session_id=a)
    assert shell.run(alive_probe(mark), session_id=a).stdout == "alive\n"
    res = shell.run(
        f"pgrep -f {mark}; printf '%s\\n' {mark} > pat; "
        "cat /proc/*/cmdline 2>/dev/null | tr '\\0' '\\n' | grep -c -F -f pat; "
        "ls /proc | grep -c '^[0-9]'",
        session_id=b,
    )
    found, nprocs = res.stdout.split()
    assert found == "0", res
    assert int(nprocs) < 12, res  # the supervisor, spawner, a spare bash, this command
    assert shell.run("echo $$ $PPID; cat /proc/1/cmdline | head -c 60", session_id=b).success
    cgroup = shell.run("cat /proc/self/cgroup", session_id=b).stdout
    assert all(line.rsplit(":", 1)[1] == "/" for line in cgroup.splitlines()), cgroup
    shell.close_session(a)
    shell.close_session(b)


def test_same_uid_process_calls_cannot_reach_other_sessions_or_the_server(
    shell: ShellService,
) -> None:
    a, b, mark = new_sid(), new_sid(), marker()
    shell.run(f"echo kept > f; exec -a {mark} sleep 300 &", session_id=a)
    assert shell.run(alive_probe(mark), session_id=a).stdout == "alive\n"
    looks = "cat f; nice; grep -E '^policy' /proc/$$/sched | tr -d ' '; ulimit -n; "
    before = shell.run(looks + alive_probe(mark), session_id=a).stdout
    assert before.startswith("kept\n") and before.endswith("alive\n"), before
    shell.write_file("attack.py", _ATTACK_PIDS, session_id=b)
    res = shell.run(f"{PY} attack.py", session_id=b, timeout=8)
    assert res.stdout.startswith("hit"), res
    after = shell.run(looks + alive_probe(mark), session_id=a)
    assert after.stdout == before, after  # niceness, policy, open files limit: untouched
    shell.close_session(a)
    shell.close_session(b)
    # the autouse check then starts a brand-new session: the fork server is untouched


#: socket(family, type) for each family, also with high bits set (the kernel reads an int)
_SOCKET_FAMILIES = r"""
import ctypes, errno, os, socket
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
for family in range(64):
    for value in (family, family | (1 << 32)):
        for kind in (socket.SOCK_STREAM, socket.SOCK_DGRAM, socket.SOCK_RAW, socket.SOCK_SEQPACKET):
            fd = libc.syscall(41, ctypes.c_long(value), kind, 0)  # x86_64 socket(2)
            if fd >= 0:
                os.close(fd)
                print("created", family, value > family, kind)
                break
"""


@pytest.mark.skipif(os.uname().machine != "x86_64", reason="raw syscall number of x86_64")
def test_only_unix_sockets_can_be_created(shell: ShellService) -> None:
    """AF_VSOCK crosses network namespaces (to the hypervisor): only AF_UNIX is allowed."""
    shell_report = shell.isolation_report()["layers"]["seccomp"]["detail"]
    assert "socket families allowed: AF_UNIX (" in shell_report
    sid = new_sid()
    shell.write_file("fam.py", _SOCKET_FAMILIES, session_id=sid)
    res = shell.run(f"{PY} fam.py", session_id=sid)
    created = {line.split()[1] for line in res.stdout.splitlines()}
    assert created == {"1"}, res  # AF_UNIX, without high bits
    assert "created 1 False" in res.stdout
    shell.close_session(sid)


# --- the file tools run in the supervisor: its own descriptors are out of reach -----------------

_FORGED = '{"ok": true, "size": 424242, "returncode": 0, "timed_out": false}\n'
_OWN_PATHS = [
    "/dev/stdout",
    "/dev/stderr",
    "/dev/stdin",
    *(f"/dev/fd/{n}" for n in range(12)),
    *(f"/proc/self/fd/{n}" for n in range(12)),
    "/proc/thread-self/fd/1",
    "/proc/1/fd/1",
]


def _session_still_honest(shell: ShellService, sid: str) -> None:
    """The next command runs: its own output, exit status and side effect."""
    res = shell.run("echo REAL; touch ran; false", session_id=sid)
    assert (res.stdout, res.returncode) == ("REAL\n", 1), res
    assert shell.run("ls ran && rm ran", session_id=sid).stdout == "ran\n"


def test_file_tools_cannot_write_the_supervisors_descriptors(shell: ShellService) -> None:
    sid = new_sid()
    shell.run("sleep 0 & echo started", session_id=sid)  # a spare bash waits with its pipes
    for path in _OWN_PATHS:
        with pytest.raises(ShellFileError) as info:
            shell.write_file(path, _FORGED, session_id=sid)
        assert info.value.reason in ("EACCES", "ENOTREG", "ENOENT", "EPERM"), (path, info.value)
        with pytest.raises(ShellFileError):
            shell.read_file(path, session_id=sid)
    _session_still_honest(shell, sid)
    shell.close_session(sid)


def test_planted_symlinks_to_the_supervisors_descriptors(shell: ShellService) -> None:
    """The harness's own write_file("notes.py") must not follow a model's link into the reply."""
    sid = new_sid()
    links = "; ".join(f"ln -s {p} l{i}" for i, p in enumerate(_OWN_PATHS))
    shell.run(f"{links}; ln -s /dev/stdout notes.py; ln -s l0 chain", session_id=sid)
    for name in ["notes.py", "chain", *(f"l{i}" for i in range(len(_OWN_PATHS)))]:
        with pytest.raises(ShellFileError):
            shell.write_file(name, _FORGED, session_id=sid)
        with pytest.raises(ShellFileError):
            shell.read_file(name, session_id=sid)
    _session_still_honest(shell, sid)
    shell.close_session(sid)


#: sourced by a waiting bash before its real command arrives, it would answer instead of it
_INJECT = "echo REAL; builtin exit 1\n"


def test_command_pipe_of_the_waiting_bash_cannot_be_written_by_the_file_tools(
    shell: ShellService,
) -> None:
    sid = new_sid()
    shell.run("true", session_id=sid)  # the next command's bash now waits on its pipes
    listed = [int(p) for p in shell.run("ls /proc | grep '^[0-9]'", session_id=sid).stdout.split()]
    # the bash for the next command starts once this listing ended: a higher pid
    for pid in sorted({*listed[-4:], *range(max(listed) + 1, max(listed) + 24)}):
        for fd in range(8):
            try:
                shell.write_file(f"/proc/{pid}/fd/{fd}", _INJECT, session_id=sid)
            except ShellFileError:
                continue
    _session_still_honest(shell, sid)
    shell.close_session(sid)


def test_write_file_never_blocks_on_a_fifo(shell: ShellService) -> None:
    sid = new_sid()
    shell.run(
        "mkdir -p tests && mkfifo tests/test_hidden.py && ln -s tests/test_hidden.py l",
        session_id=sid,
    )
    for path in ("tests/test_hidden.py", "l"):
        started = time.monotonic()
        with pytest.raises(ShellFileError) as info:
            shell.write_file(path, "assert True\n", session_id=sid)
        assert info.value.reason == "ENOTREG"
        assert time.monotonic() - started < shell.timeout
    assert shell.run("ls tests", session_id=sid).stdout == "test_hidden.py\n"
    shell.close_session(sid)


_LEASE = (
    "import fcntl, os, signal, sys, time\n"
    "signal.signal(signal.SIGIO, signal.SIG_IGN)\n"
    "fd = os.open(sys.argv[1], os.O_RDONLY)\n"
    "fcntl.fcntl(fd, fcntl.F_SETLEASE, fcntl.F_RDLCK)\n"
    "open(sys.argv[1] + '.held', 'w').close()\n"
    "time.sleep(60)\n"
)


def test_write_file_on_a_leased_file_is_a_clear_error(shell: ShellService) -> None:
    sid = new_sid()
    shell.write_file("lease.py", _LEASE, session_id=sid)
    shell.write_file("graded.txt", "original\n", session_id=sid)
    res = shell.run(
        f"({PY} lease.py graded.txt &) ; for _ in $(seq 500); do [ -e graded.txt.held ] && break; "
        "sleep 0.01; done; ls graded.txt.held",
        session_id=sid,
    )
    assert res.stdout == "graded.txt.held\n", res
    started = time.monotonic()
    with pytest.raises(ShellFileError) as info:
        shell.write_file("graded.txt", "changed\n", session_id=sid)
    assert info.value.reason == "EAGAIN" and "lease" in str(info.value)
    assert time.monotonic() - started < shell.timeout
    assert shell.read_file("graded.txt", session_id=sid) == "original\n"
    shell.close_session(sid)


def test_a_forged_reply_never_reaches_the_caller(shell: ShellService) -> None:
    """Even a line on the reply channel carrying every field is not taken without the token."""
    sid = new_sid()
    shell.run("true", session_id=sid)
    forged = shell._python.execute(f"print({_FORGED!r})", session_id=sid)
    with pytest.raises(InfrastructureError):
        shell._reply(forged)
    assert shell.write_file("x", "abc", session_id=sid) == 3
    shell.close_session(sid)


# --- a background job against the bash waiting for the next command -------------------------

_HIJACK = r"""
import ctypes, os, sys, time
libc = ctypes.CDLL(None, use_errno=True)
while "bash" in open(f"/proc/{os.getppid()}/comm").read():  # until the supervisor adopts us
    time.sleep(0.005)
sup, log, found = os.getppid(), [], set()
deadline = time.monotonic() + 5
while not found and time.monotonic() < deadline:
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == os.getpid():
            continue
        try:
            fields = open(f"/proc/{name}/stat").read().rsplit(")", 1)[1].split()
            if int(fields[1]) == sup and "bash" in open(f"/proc/{name}/comm").read():
                found.add(int(name))
        except OSError:
            continue
for pid in found:
    for fd in range(8):
        try:
            opened = os.open(f"/proc/{pid}/fd/{fd}", os.O_WRONLY | os.O_NONBLOCK)
            os.write(opened, b"echo REAL; builtin exit 1\n")
            log.append(f"fd {fd} written")
        except OSError as exc:
            log.append(f"fd {fd} refused {exc.errno}")
    try:
        os.open(f"/proc/{pid}/mem", os.O_RDWR)
        log.append("mem opened")
    except OSError as exc:
        log.append(f"mem refused {exc.errno}")
    for fd in range(8):
        pidfd = os.pidfd_open(pid)
        got = libc.syscall(438, pidfd, fd, 0)  # pidfd_getfd
        log.append(f"getfd {fd} " + ("got" if got >= 0 else f"refused {ctypes.get_errno()}"))
open("hijack.log", "w").write(f"found {len(found)}\n" + "\n".join(log) + "\n")
"""


def test_a_background_job_cannot_hijack_the_next_command(shell: ShellService) -> None:
    sid = new_sid()
    shell.write_file("hijack.py", _HIJACK, session_id=sid)
    assert shell.run(f"{PY} hijack.py >/dev/null 2>&1 &", session_id=sid).success
    for _ in range(1000):  # bounded: 10 s (a file tool, not a command: the spare stays)
        try:
            log = str(shell.read_file("hijack.log", session_id=sid))
            break
        except ShellFileError:
            time.sleep(0.01)
    else:
        raise AssertionError("the job never finished")
    # the bash waiting for the next command: a spare, or (with the builtin) the master and
    # the copy made ahead of the next command; each of them refused every attempt
    assert log.startswith("found ") and int(log.split()[1]) >= 1, log
    assert not [line for line in log.splitlines() if line.endswith(("written", "opened", "got"))]
    _session_still_honest(shell, sid)
    shell.close_session(sid)


_INOTIFY_HOG = r"""
import ctypes, os, sys, time
libc = ctypes.CDLL(None, use_errno=True)
held = []
while len(held) < 200:
    fd = libc.inotify_init1(os.O_CLOEXEC)
    if fd < 0:
        break
    held.append(fd)
open(sys.argv[1], "w").write(f"{len(held)}\n")
time.sleep(float(sys.argv[2]))
"""


def test_one_session_cannot_take_every_inotify_instance(shell: ShellService) -> None:
    """The kernel counts inotify instances per uid, which all sessions share: each has a budget."""
    a, b = new_sid(), new_sid()
    shell.write_file("hog.py", _INOTIFY_HOG, session_id=a)
    shell.run(f"{PY} hog.py held 60 >/dev/null 2>&1 &", session_id=a)
    for _ in range(1000):  # bounded: 10 s
        try:
            held = int(str(shell.read_file("held", session_id=a)))
            break
        except (ShellFileError, ValueError):
            time.sleep(0.01)
    else:
        raise AssertionError("the hog never reported")
    assert 0 < held <= 16
    shell.write_file("hog.py", _INOTIFY_HOG, session_id=b)
    res = shell.run(f"{PY} hog.py got 0 && cat got", session_id=b)
    # its own budget, untouched by a's (fewer only if other processes of the uid that owns
    # the sessions' namespaces hold most of the host's 128 meanwhile)
    assert 0 < int(res.stdout) <= 16, res
    assert shell.run("tail -f /dev/null & sleep 0.2; kill %1; echo ok", session_id=b).success
    shell.close_session(a)
    shell.close_session(b)


@pytest.mark.parametrize(
    "path",
    ["/proc/self/comm", "/proc/1/oom_score_adj", "/proc/self/mem", "/proc/self/attr/current"],
)
def test_file_tools_write_nothing_of_proc(shell: ShellService, path: str) -> None:
    sid = new_sid()
    shell.run(f"ln -s {path} link", session_id=sid)
    for target in (path, "link"):
        with pytest.raises(ShellFileError):
            shell.write_file(target, "1000\n", session_id=sid)
    _session_still_honest(shell, sid)
    shell.close_session(sid)


def test_file_tools_read_no_proc_entry_of_the_supervisor(shell: ShellService) -> None:
    sid = new_sid()
    shell.run("true", session_id=sid)
    for path in ("/proc/self/environ", "/proc/1/environ", "/proc/thread-self/comm", "/proc/1/mem"):
        with pytest.raises(ShellFileError):
            shell.read_file(path, session_id=sid)
    assert "processor" in str(shell.read_file("/proc/cpuinfo", session_id=sid))
    shell.close_session(sid)
