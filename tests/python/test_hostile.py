"""Hostile snippets, by category, each with the safe outcome it must get.

Every snippet is bounded (short timeouts, small outputs, capped loops), so
that it cannot harm the machine even if an isolation layer were missing.
"""

from __future__ import annotations

import os
import socket
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import pytest

from toolservices.errors import InfrastructureError
from toolservices.python import ExecResult, PythonExecutorService, SandboxConfig

# --- output ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "code",
    [
        pytest.param("import sys\nwhile True:\n    sys.stdout.write('x' * 1000)", id="stdout"),
        pytest.param("import sys\nwhile True:\n    print('e' * 999, file=sys.stderr)", id="stderr"),
        pytest.param(
            "import os\nwhile True:\n    try:\n        os.write(1, b'y' * 4096)\n"
            "    except OSError:\n        pass",  # EFBIG at the file size limit: keep going
            id="fd-level",
        ),
    ],
)
def test_flood_until_timeout_still_says_truncated(
    service: PythonExecutorService, code: str
) -> None:
    result = service.execute(code, timeout=1.0)
    assert result.timed_out and result.truncated
    cap = 64 * 1024  # the fixture's max_output
    assert len(result.stdout) <= cap + 200 and len(result.stderr) <= cap + 400
    assert "output truncated" in result.stdout + result.stderr


def test_output_exactly_at_the_cap_is_not_truncated() -> None:
    with PythonExecutorService(pool_size=1, timeout=5, max_output=1000) as svc:
        exact = svc.execute("print('x' * 999)")  # 999 + newline = the cap
        assert exact.stdout == "x" * 999 + "\n" and not exact.truncated
        over = svc.execute("print('x' * 1000)")
        assert over.truncated and over.stdout.startswith("x" * 1000)
        assert "1 more bytes not shown" in over.stdout


# --- protocol ----------------------------------------------------------------------------

FORGE_LATER = """
import json, os, struct, sys, threading
f = sys._getframe()
while f.f_code.co_name != "serve":
    f = f.f_back
chan, seq = f.f_locals["self"].chan, f.f_locals["frame"].seq
r, w = os.pipe()
meta = json.dumps({"rc": 0, "exc": None, "dur": 0.0, "dropped": [0, 0]}).encode()

def forge():
    os.read(r, 1)  # the next call has started: its reply is what we forge
    guess = (seq + 1) & 0xFFFFFFFF  # the next number, were they counted
    chan.sendall(struct.pack("<IIB", len(meta), guess, 11) + meta)

threading.Thread(target=forge, daemon=True).start()
"""


def test_a_frame_forged_for_a_later_call_is_never_accepted(
    service: PythonExecutorService, sid: str
) -> None:
    assert service.execute(FORGE_LATER, session_id=sid).success
    later = "import os, time\nos.write(w, b'x')\ntime.sleep(1)\nraise ValueError('real outcome')"
    result = service.execute(later, session_id=sid)
    assert not result.success  # the forged "success" was refused
    assert result.exception is not None
    assert result.exception.type in ("ValueError", "InterpreterExit"), result
    if result.exception.type == "InterpreterExit":
        assert "protocol violation" in result.exception.message and result.restarted
    after = service.execute("print('clean')", session_id=sid)
    assert after.success and after.stdout == "clean\n"
    service.close_session(sid)


def test_a_forged_reply_for_the_current_call_restarts_the_session_next_time(
    service: PythonExecutorService, sid: str
) -> None:
    forge_now = FORGE_LATER.replace("os.read(r, 1)", "pass").replace("(seq + 1)", "seq")
    service.execute("kept = 1", session_id=sid)
    service.execute(forge_now + "import time\ntime.sleep(0.5)", session_id=sid)
    # the genuine reply comes after the forged one: found as stray data before the next call
    # runs (a fresh interpreter runs it) or as a reply out of turn (the call is refused)
    result = service.execute("print('kept' in globals())", session_id=sid)
    assert result.restarted and not (result.success and result.stdout == "True\n")
    service.close_session(sid)


# --- cross-session state (filesystem) and per-session process budget ------------------------


def _needs(service: PythonExecutorService, layer: str) -> None:
    entry = service.isolation_report()["layers"].get(layer, {})
    if not entry.get("active"):
        pytest.skip(f"layer {layer} inactive here: {entry.get('why')}")


WRITE_STATE = (
    "import os\n"
    "for path in ('/tmp/leak', '/dev/shm/leak', os.path.expanduser('~/leak')):\n"
    "    open(path, 'w').write('from ' + os.getcwd())\n"
    "print(os.environ['HOME'], os.environ['TMPDIR'])\n"
)
READ_STATE = (
    "import os\n"
    "print(sorted(p for p in ('/tmp/leak', '/dev/shm/leak', os.path.expanduser('~/leak'))\n"
    "             if os.path.exists(p)))\n"
)


def test_a_fresh_session_sees_nothing_another_left_in_tmp_shm_or_home(
    service: PythonExecutorService, sid: str
) -> None:
    _needs(service, "session_namespaces")
    wrote = service.execute(WRITE_STATE, session_id=sid)
    assert wrote.success, wrote.stderr
    assert (
        service.execute(READ_STATE, session_id=sid).stdout
        == str(sorted(["/tmp/leak", "/dev/shm/leak", wrote.stdout.split()[0] + "/leak"])) + "\n"
    )  # the session itself keeps them
    while_alive = service.execute(READ_STATE, session_id=f"{sid}-other")
    assert while_alive.success and while_alive.stdout == "[]\n"
    service.close_session(sid)
    after = service.execute(READ_STATE, session_id=sid)  # the same id, a new session
    assert after.success and after.stdout == "[]\n"
    fresh = service.execute(READ_STATE)  # no session: a fresh interpreter
    assert fresh.success and fresh.stdout == "[]\n"
    for name in (sid, f"{sid}-other"):
        service.close_session(name)


def test_fork_copies_do_not_share_writable_dirs(service: PythonExecutorService, sid: str) -> None:
    _needs(service, "session_namespaces")
    assert service.execute(WRITE_STATE, session_id=sid).success
    first, second = service.fork_session(sid, 2)
    probe = (
        "import os\n"
        "seen = open('/tmp/leak').read().startswith('from ')  # the source's, before the fork\n"
        "def denied(path):\n"
        "    try:\n"
        "        open(path, 'w').write('x')\n"
        "    except OSError as exc:\n"
        "        return exc.errno\n"
        "    return 0\n"
        "source = os.path.join(os.path.dirname(os.getcwd()), 'w0')\n"
        "print(seen, denied('/tmp/copy'), denied('/dev/shm/copy'), denied(source + '/x'),\n"
        "      denied('own.txt'), os.environ['HOME'] == os.getcwd())\n"
    )
    for copy in (first, second):
        result = service.execute(probe, session_id=copy)
        assert result.stdout == "True 13 13 13 0 True\n", result.stderr
    # each copy writes only its own directory: the other copy cannot see it
    assert service.execute("print(open('own.txt').read())", session_id=first).stdout == "x\n"
    other = service.execute(
        f"import os\nprint(os.path.exists(os.path.join('..', {os.path.basename(first)!r})))",
        session_id=second,
    )
    assert other.stdout in ("False\n", "")
    for name in (sid, first, second):
        service.close_session(name)


FORK_BOMB = (
    "import os, time\n"
    "n = 0\n"
    "for _ in range(200):\n"
    "    try:\n"
    "        pid = os.fork()\n"
    "    except OSError:\n"
    "        break\n"
    "    if pid == 0:\n"
    "        time.sleep(60)\n"  # held until the session is closed
    "        os._exit(0)\n"
    "    n += 1\n"
    "print('FORKED', n)\n"
)
FORK_TEN = (
    "import os\n"
    "kids = [pid for pid in (os.fork() for _ in range(10)) if pid or os._exit(0)]\n"
    "print('OK', len([os.waitpid(pid, 0) for pid in kids]))\n"
)


def test_each_session_has_its_own_process_budget(service: PythonExecutorService, sid: str) -> None:
    _needs(service, "nproc_limit")
    bomb = service.execute(FORK_BOMB, session_id=sid, timeout=30)
    forked = int(bomb.stdout.split()[1])
    assert forked < 200 and forked <= 64, bomb.stdout  # the default budget
    # while the bomb's children still hold the whole budget, other sessions fork freely
    for other in (f"{sid}-b", f"{sid}-c"):
        result = service.execute(FORK_TEN, session_id=other, timeout=30)
        assert result.stdout == "OK 10\n", result.stderr
    again = service.execute(FORK_BOMB, session_id=f"{sid}-b", timeout=30)
    assert int(again.stdout.split()[1]) <= 64
    for name in (sid, f"{sid}-b", f"{sid}-c"):
        service.close_session(name)


def test_the_process_budget_is_configurable() -> None:
    config = SandboxConfig(nproc=8)
    with PythonExecutorService(pool_size=1, timeout=30, sandbox=config) as svc:
        _needs(svc, "nproc_limit")
        result = svc.execute(FORK_BOMB)
        assert result.success and 0 < int(result.stdout.split()[1]) <= 8, result


def test_without_session_namespaces_the_report_says_so() -> None:
    from toolservices.python import isolation_report

    report = isolation_report(SandboxConfig(session_namespaces=False))
    layer = report["layers"]["session_namespaces"]
    assert not layer["active"] and "session_namespaces=False" in layer["why"]
    assert "per session" not in report["layers"]["nproc_limit"].get("detail", "")


# --- the corpus: one snippet per line, with the safe outcome it must get --------------------

SECRET = f"TS_HOSTILE_SECRET_{os.urandom(8).hex()}"
os.environ["TS_HOSTILE_SECRET"] = SECRET  # the trainer's environment: never reaches user code


@dataclass(frozen=True)
class Case:
    code: str
    check: Callable[[ExecResult], bool]
    timeout: float = 5.0
    needs: str = ""  # a layer that must be active, else the case is skipped


def _out(text: str) -> Callable[[ExecResult], bool]:
    return lambda r: r.stdout == text


def _exc(kind: str) -> Callable[[ExecResult], bool]:
    return lambda r: r.exception is not None and r.exception.type == kind and not r.timed_out


def _timed_out(r: ExecResult) -> bool:
    return r.timed_out and not r.success and r.returncode == -1


def _denied(path_op: str) -> str:
    return f"try:\n    {path_op}\n    print('DONE')\nexcept OSError as exc:\n    print('DENIED')\n"


CORPUS: dict[str, Case] = {
    # timeouts: the wall clock wins, whatever the code does with signals
    "timeouts/busy-loop": Case("while True:\n    pass", _timed_out, 1.0),
    "timeouts/sleep": Case("import time\ntime.sleep(60)", _timed_out, 1.0),
    "timeouts/signals-ignored": Case(
        "import signal\nfor s in (signal.SIGINT, signal.SIGTERM, signal.SIGALRM):\n"
        "    signal.signal(s, signal.SIG_IGN)\nwhile True:\n    pass",
        _timed_out,
        1.0,
    ),
    "timeouts/signals-blocked": Case(
        "import signal\nsignal.pthread_sigmask(signal.SIG_BLOCK, signal.valid_signals())\n"
        "while True:\n    pass",
        _timed_out,
        1.0,
    ),
    "timeouts/except-baseexception": Case(
        "import time\nwhile True:\n    try:\n        time.sleep(10)\n    except BaseException:\n"
        "        pass",
        _timed_out,
        1.0,
    ),
    "timeouts/sigstop-self": Case(
        "import os, signal\nos.kill(os.getpid(), signal.SIGSTOP)", lambda r: not r.success, 1.0
    ),
    "timeouts/nondaemon-thread-does-not-hold-the-call": Case(
        "import threading, time\nthreading.Thread(target=time.sleep, args=(60,)).start()\n"
        "print('returned')",
        lambda r: r.success and r.stdout == "returned\n",
        5.0,
    ),
    # memory
    "memory/huge-bytearray": Case("x = bytearray(16 * 1024**3)", _exc("MemoryError")),
    "memory/huge-string": Case("x = ' ' * (10**11)", _exc("MemoryError")),
    # address space, not RSS: untouched anonymous maps keep the test light on a shared box
    "memory/grow-until-refused": Case(
        "import mmap\nchunks = []\ntry:\n    while True:\n"
        "        chunks.append(mmap.mmap(-1, 256 * 1024**2))\n"
        "except OSError as exc:\n    print('STOPPED', exc.errno, len(chunks) < 64)",
        _out("STOPPED 12 True\n"),
        20.0,
    ),
    # processes
    "processes/fork-bomb": Case(
        FORK_BOMB.replace("time.sleep(60)", "time.sleep(2)"),
        lambda r: r.stdout.startswith("FORKED") and int(r.stdout.split()[1]) <= 64,
        20.0,
        "nproc_limit",
    ),
    "processes/thread-bomb": Case(
        "import threading, time\nn = 0\ntry:\n    for _ in range(500):\n"
        "        threading.Thread(target=time.sleep, args=(2,), daemon=True).start()\n"
        "        n += 1\nexcept RuntimeError:\n    pass\nprint('THREADS', n)",
        lambda r: r.stdout.startswith("THREADS") and int(r.stdout.split()[1]) <= 64,
        20.0,
        "nproc_limit",
    ),
    # exits
    "exits/sys-exit-3": Case("import sys\nsys.exit(3)", lambda r: r.returncode == 3),
    "exits/sys-exit-message": Case(
        "raise SystemExit('bye')", lambda r: r.returncode == 1 and "bye" in r.stderr
    ),
    "exits/os-exit-7": Case("import os\nos._exit(7)", lambda r: r.returncode == 7),
    "exits/keyboard-interrupt-is-user-code": Case(
        "raise KeyboardInterrupt", _exc("KeyboardInterrupt")
    ),
    "exits/abort": Case("import os\nos.abort()", lambda r: r.returncode == -6),
    "exits/sigkill-self-keeps-output": Case(
        "import os\nprint('before', flush=True)\nos.kill(os.getpid(), 9)",
        lambda r: r.returncode == -9 and r.stdout.startswith("before"),
    ),
    # crashes
    "crashes/segfault-tells-where": Case(
        "import ctypes\nctypes.string_at(0)",
        lambda r: r.returncode == -11 and "Fatal Python error" in r.stderr,
    ),
    # output
    "output/invalid-utf8-nul-ansi": Case(
        "import sys\nsys.stdout.buffer.write(b'\\xff\\xfe\\x00\\x1b[31m')\nsys.stdout.flush()",
        lambda r: r.success and "\x00" in r.stdout and "\x1b[31m" in r.stdout,
    ),
    "output/lone-surrogate": Case("print('\\ud800')", lambda r: r.success and "ud800" in r.stdout),
    "output/closed-stdout": Case(
        "import sys\nsys.stdout.close()\nprint('x')", lambda r: not r.success
    ),
    "output/20mb-single-line": Case(
        "print('z' * 20_000_000)", lambda r: r.truncated and len(r.stdout) < 70_000, 10.0
    ),
    # protocol
    "protocol/garbage-on-every-socket": Case(
        "import os, stat\nfor fd in range(3, 64):\n    try:\n"
        "        if stat.S_ISSOCK(os.fstat(fd).st_mode):\n"
        "            os.write(fd, b'\\xff' * 64)\n    except OSError:\n        pass",
        lambda r: not r.success and r.exception is not None,
    ),
    "protocol/forged-end-marker-in-output": Case(
        "print('---END---')\nprint('{\"rc\": 0}')\nraise ValueError('real')", _exc("ValueError")
    ),
    # stdin
    "stdin/input-is-eof": Case("input()", _exc("EOFError")),
    "stdin/read-fd-0": Case("import os\nprint(os.read(0, 10))", _out("b''\n")),
    # secrets
    "secrets/environment-is-clean": Case(
        f"import os\nprint({SECRET!r} in repr(os.environ), 'TS_HOSTILE_SECRET' in os.environ)",
        _out("False False\n"),
    ),
    "secrets/no-process-environ-leaks": Case(
        "import glob\nfound = False\nfor path in glob.glob('/proc/[0-9]*/environ'):\n"
        "    try:\n"
        f"        found |= {SECRET!r}.encode() in open(path, 'rb').read()\n"
        "    except OSError:\n        pass\nprint(found)",
        _out("False\n"),
        needs="landlock",
    ),
    # privileges
    "privileges/no-capabilities-no-new-privs": Case(
        "s = open('/proc/self/status').read()\n"
        "print(s.split('CapEff:')[1].split()[0], s.split('NoNewPrivs:')[1].split()[0])",
        _out("0000000000000000 1\n"),
        needs="session_namespaces",
    ),
    "privileges/setuid-root-fails": Case(  # EPERM, or EINVAL where uid 0 is not even mapped
        "import os\nos.setuid(0)",
        lambda r: r.exception is not None and r.exception.type in ("PermissionError", "OSError"),
    ),
    "privileges/not-root": Case("import os\nprint(os.getuid() != 0)", _out("True\n")),
    # filesystem
    "filesystem/write-etc": Case(_denied("open('/etc/ts_hostile', 'w')"), _out("DENIED\n")),
    "filesystem/write-outside-workdir": Case(
        _denied("open('../../ts_hostile', 'w')"), _out("DENIED\n"), needs="readonly_fs"
    ),
    "filesystem/read-shadow": Case(_denied("open('/etc/shadow').read()"), _out("DENIED\n")),
    "filesystem/hardlink-host-file": Case(
        _denied("__import__('os').link('/etc/passwd', 'pw')"), _out("DENIED\n"), needs="readonly_fs"
    ),
    # resources
    "resources/open-files-cap": Case(
        "fhs = []\ntry:\n    while len(fhs) < 5000:\n        fhs.append(open('/dev/null'))\n"
        "except OSError as exc:\n    print('EMFILE', exc.errno, len(fhs) < 300)",
        _out("EMFILE 24 True\n"),
    ),
    "resources/disk-fill": Case(
        "chunk = b'x' * (1 << 20)\ntry:\n    with open('fill.bin', 'wb') as fh:\n"
        "        for _ in range(200):\n            fh.write(chunk)\n            fh.flush()\n"
        "except OSError as exc:\n    print('STOPPED', exc.errno)",
        _out("STOPPED 27\n"),
        10.0,
    ),
    "resources/shm-fill": Case(
        "chunk = b'x' * (1 << 20)\ntry:\n    with open('/dev/shm/fill', 'wb') as fh:\n"
        "        for _ in range(200):\n            fh.write(chunk)\n            fh.flush()\n"
        "except OSError as exc:\n    print('STOPPED', exc.errno in (27, 28))",
        _out("STOPPED True\n"),
        10.0,
        "private_tmp",
    ),
    # network
    "network/udp-dns": Case(
        "import socket\ntry:\n    socket.getaddrinfo('example.com', 80)\n    print('RESOLVED')\n"
        "except OSError:\n    print('BLOCKED')",
        _out("BLOCKED\n"),
        needs="network",
    ),
    # cross-session state: a fresh interpreter after these sees none of it
    # breaking builtins also breaks the interpreter's own reply: reported, never a hang
    "cross-session/patch-builtins": Case(
        "import builtins\nbuiltins.print = None\nbuiltins.len = lambda x: 0",
        lambda r: r.success or (r.exception is not None and r.exception.type == "InterpreterExit"),
    ),
    "cross-session/plant-modules": Case(
        "open('json.py', 'w').write('raise SystemExit(9)')\n"
        "open('/tmp/sitecustomize.py', 'w').write('raise SystemExit(9)')",
        lambda r: r.success,
    ),
}


@pytest.mark.parametrize("name", sorted(CORPUS))
def test_hostile_corpus(service: PythonExecutorService, name: str) -> None:
    case = CORPUS[name]
    if case.needs:
        _needs(service, case.needs)
    result = service.execute(case.code, timeout=case.timeout)
    assert case.check(result), result
    assert SECRET not in result.stdout + result.stderr
    # the executor is unharmed and a fresh interpreter sees nothing of the snippet
    after = service.execute(
        "import json, sys, os\nprint(len('ab'), 'sitecustomize' in sys.modules, "
        "os.path.exists('json.py'), os.path.exists('fill.bin'))"
    )
    assert after.success and after.stdout == "2 False False False\n", after


def test_hostile_corpus_in_one_session_leaves_it_usable(
    service: PythonExecutorService, sid: str, listener: tuple[int, list[int]]
) -> None:
    """The survivable cases, one after another in one session; it answers afterwards."""
    port, accepted = listener
    for name in ("exits/sys-exit-3", "output/lone-surrogate", "stdin/input-is-eof"):
        result = service.execute(CORPUS[name].code, session_id=sid)
        assert CORPUS[name].check(result), (name, result)
    reach = service.execute(
        f"import socket\ntry:\n    socket.create_connection(('127.0.0.1', {port}), 2)\n"
        "    print('CONNECTED')\nexcept OSError:\n    print('BLOCKED')",
        session_id=sid,
    )
    if service.isolation_report()["layers"]["network"]["active"]:
        assert reach.stdout == "BLOCKED\n" and not accepted
    assert service.execute("print('alive')", session_id=sid).stdout == "alive\n"
    service.close_session(sid)


@pytest.fixture
def listener() -> Iterator[tuple[int, list[int]]]:
    """A TCP listener on the host's loopback, counting the connections it accepts."""
    server = socket.create_server(("127.0.0.1", 0))
    server.settimeout(0.2)
    accepted: list[int] = []
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except TimeoutError:
                continue
            accepted.append(1)
            conn.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield server.getsockname()[1], accepted
    finally:
        stop.set()
        thread.join(timeout=5)
        server.close()


def test_a_source_forks_as_many_copies_as_its_budget_allows() -> None:
    """A source and its copies share one budget: n copies need n + 1 places, not 2n."""
    with PythonExecutorService(pool_size=1, timeout=30, sandbox=SandboxConfig(nproc=8)) as svc:
        _needs(svc, "session_namespaces")
        svc.execute("x = 5", session_id="src")
        copies = svc.fork_session("src", 7)  # the last copy's fork briefly needs one more
        results = [svc.execute("print(x)", session_id=c).stdout for c in copies]
        assert results == ["5\n"] * 7
        with pytest.raises(InfrastructureError, match="could not fork"):
            svc.fork_session("src", 1)  # the budget is used up: the source stays usable
        assert svc.execute("print(x + 1)", session_id="src").stdout == "6\n"
        svc.close_session(copies[0])
        assert len(svc.fork_session("src", 1)) == 1
