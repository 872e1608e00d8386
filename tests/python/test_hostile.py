"""Hostile snippets, by category, each with the safe outcome it must get.

Every snippet is bounded (short timeouts, small outputs, capped loops), so
that it cannot harm the machine even if an isolation layer were missing.
"""

from __future__ import annotations

import os

import pytest

from toolservices.python import PythonExecutorService, SandboxConfig

# --- recursion ---------------------------------------------------------------------------

RAISED_LIMIT = "import sys\nsys.setrecursionlimit(10**6)\n"


@pytest.mark.parametrize(
    "code",
    [
        pytest.param(RAISED_LIMIT + "def f(n):\n    return f(n + 1)\nf(0)", id="python-frames"),
        pytest.param(
            RAISED_LIMIT + "x = []\nfor _ in range(10**6):\n    x = [x]\nrepr(x)", id="c-repr"
        ),
        pytest.param(
            RAISED_LIMIT + "import functools\n@functools.lru_cache(None)\n"
            "def g(n):\n    return 0 if n == 0 else g(n - 1) + 1\ng(10**6)",
            id="c-lru-cache",
        ),
    ],
)
def test_deep_recursion_ends_in_recursion_error(service: PythonExecutorService, code: str) -> None:
    """A raised recursion limit ends in RecursionError: no timeout, no SIGSEGV, short stderr."""
    result = service.execute(code, timeout=20)  # a million-frame traceback took ~40 s
    assert not result.timed_out, result.stderr[-500:]
    assert result.exception is not None and result.exception.type == "RecursionError", result
    assert "RecursionError" in result.stderr and len(result.stderr) < 50_000
    assert not result.restarted


def test_deep_traceback_is_cut_to_its_innermost_frames(
    service: PythonExecutorService, sid: str
) -> None:
    code = RAISED_LIMIT + "def f(n):\n    return f(n + 1) if n < 5000 else 1 / 0\nf(0)"
    result = service.execute(code, session_id=sid)
    assert result.exception is not None and result.exception.type == "ZeroDivisionError"
    assert "earlier frames not shown" in result.stderr
    assert result.stderr.count("line 5, in f") <= 2  # repeats folded, tail only
    capped = service.execute("import sys\nprint(sys.getrecursionlimit())", session_id=sid)
    assert 10_000 <= int(capped.stdout) < 10**6  # clamped to what the stack holds
    service.close_session(sid)


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
