"""Sessions: semantics of one call, persistence, and hostile snippets with their safe outcome.

Every snippet is bounded (short timeouts, small outputs) so that it cannot harm
the machine even if an isolation layer were missing.
"""

from __future__ import annotations

import pytest
from tests.python.conftest import wait_until_gone

from toolservices.python import ExecResult, PythonExecutorService
from toolservices.python.runtime import AFTER_REPLY


def test_result_is_the_contract_mapping(service: PythonExecutorService) -> None:
    result = service.execute("print('hello')")
    assert isinstance(result, ExecResult)
    assert {"success", "stdout", "stderr", "returncode"} <= set(result)
    assert (result["success"], result["stdout"], result["stderr"], result["returncode"]) == (
        True,
        "hello\n",
        "",
        0,
    )
    as_dict = result.to_dict()
    assert as_dict["success"] is True and as_dict["exception"] is None
    assert dict(result) == as_dict


def test_exception_gives_traceback_and_failure(service: PythonExecutorService) -> None:
    result = service.execute("def f():\n    raise ValueError('Test error')\nf()")
    assert not result.success and result.returncode == 1
    assert result.exception is not None and result.exception.type == "ValueError"
    assert result.exception.message == "Test error"
    assert "ValueError: Test error" in result.stderr
    assert "line 2, in f" in result.stderr and "raise ValueError" in result.stderr
    assert "_worker" not in result.stderr  # the traceback starts at the user's code


def test_syntax_error(service: PythonExecutorService) -> None:
    result = service.execute("def (:\n")
    assert not result.success and result.exception is not None
    assert result.exception.type == "SyntaxError" and "SyntaxError" in result.stderr


def test_warnings_do_not_fail(service: PythonExecutorService) -> None:
    result = service.execute("import warnings\nwarnings.warn('careful')\nprint('done')")
    assert result.success and result.stdout == "done\n" and "careful" in result.stderr


def test_module_like_scope(service: PythonExecutorService) -> None:
    code = "k = 3\ndef f():\n    return k * 2\nprint(f(), [k + i for i in range(2)])"
    assert service.execute(code).stdout == "6 [3, 4]\n"


def test_session_persistence_and_isolation(service: PythonExecutorService, sid: str) -> None:
    assert service.execute("secret = 41", session_id=sid).success
    assert service.execute("print(secret + 1)", session_id=sid).stdout == "42\n"
    other = service.execute("print(secret)", session_id=sid + "-other")
    assert not other.success and "NameError" in other.stderr
    fresh = service.execute("print(secret)")
    assert not fresh.success
    service.close_session(sid + "-other")
    service.close_session(sid)


def test_closed_session_starts_clean(service: PythonExecutorService, sid: str) -> None:
    service.execute("v = 1", session_id=sid)
    service.close_session(sid)
    service.close_session(sid)  # idempotent
    result = service.execute("print('v' in globals())", session_id=sid)
    assert result.stdout == "False\n" and not result.restarted
    service.close_session(sid)


def test_stdout_and_stderr_are_separate(service: PythonExecutorService) -> None:
    code = "import sys\nprint('out')\nprint('err', file=sys.stderr)\nsys.stdout.write('no newline')"
    result = service.execute(code)
    assert result.stdout == "out\nno newline" and result.stderr == "err\n"


def test_fd_level_output_is_captured(service: PythonExecutorService) -> None:
    code = (
        "import os, subprocess, sys\n"
        "print('py')\n"
        "os.write(1, b'fd1\\n')\n"
        "subprocess.run([sys.executable, '-c', 'print(\"child\")'], check=True)\n"
        "os.write(2, b'fd2\\n')\n"
    )
    result = service.execute(code)
    assert result.success, result.stderr
    assert result.stdout == "py\nfd1\nchild\n" and result.stderr == "fd2\n"


@pytest.mark.parametrize(
    "code",
    [
        "print('---END---')\nprint('---READY---')",
        "import sys, struct\nsys.stdout.buffer.write(struct.pack('<IIB', 5, 1, 11) + b'{}')",
        'print(\'{"rc": 0, "exc": null}\')',
    ],
    ids=["sentinels", "fake-frame-header", "fake-result-json"],
)
def test_protocol_looking_output_is_just_output(
    service: PythonExecutorService, sid: str, code: str
) -> None:
    result = service.execute(code, session_id=sid)
    assert result.success and not result.restarted and result.stdout
    after = service.execute("print('next')", session_id=sid)
    assert after.stdout == "next\n" and not after.restarted
    service.close_session(sid)


def test_nul_invalid_utf8_and_surrogates(service: PythonExecutorService) -> None:
    code = (
        "import sys\n"
        "print('a\\x00b')\n"
        "sys.stdout.buffer.write(b'\\xff\\xfe bad\\n')\n"
        "print('\\udcff lone')\n"
        "print('\\x1b[31mred\\x1b[0m', end='')"
    )
    result = service.execute(code)
    assert result.success, result.stderr
    assert "a\x00b\n" in result.stdout and "\ufffd\ufffd bad\n" in result.stdout
    assert "\\udcff lone" in result.stdout and result.stdout.endswith("\x1b[31mred\x1b[0m")


def test_stdin_gives_eof(service: PythonExecutorService) -> None:
    result = service.execute("try:\n    input('? ')\nexcept EOFError:\n    print('eof')")
    assert result.stdout.endswith("eof\n")
    result = service.execute("import sys\nprint(repr(sys.stdin.read()))")
    assert result.stdout == "''\n"


def test_huge_output_is_truncated_with_marker(service: PythonExecutorService, sid: str) -> None:
    result = service.execute("print('x' * 1_000_000)\nprint('y' * 10)", session_id=sid)
    assert result.success and result.truncated
    assert len(result.stdout) < 64 * 1024 + 200
    assert "output truncated" in result.stdout
    flood = service.execute(
        "import os\nfor _ in range(200):\n    os.write(1, b'z' * 4096)", session_id=sid
    )
    assert flood.truncated and len(flood.stdout) < 64 * 1024 + 200
    assert service.execute("print('ok')", session_id=sid).stdout == "ok\n"
    service.close_session(sid)


def test_sys_exit_keeps_the_session(service: PythonExecutorService, sid: str) -> None:
    service.execute("kept = 1", session_id=sid)
    assert service.execute("import sys\nsys.exit()", session_id=sid).returncode == 0
    three = service.execute("import sys\nsys.exit(3)", session_id=sid)
    assert (three.success, three.returncode, three.restarted) == (False, 3, False)
    message = service.execute("raise SystemExit('bye')", session_id=sid)
    assert message.returncode == 1 and "bye" in message.stderr
    assert service.execute("print(kept)", session_id=sid).stdout == "1\n"
    service.close_session(sid)


@pytest.mark.parametrize(
    ("code", "returncode"),
    [
        ("import os\nos._exit(7)", 7),
        ("import os, signal\nos.kill(os.getpid(), signal.SIGKILL)", -9),
        ("import ctypes\nctypes.string_at(0)", -11),
        ("import os, signal\nos.kill(os.getpid(), signal.SIGABRT)", -6),
    ],
    ids=["os_exit", "sigkill", "segfault", "abort"],
)
def test_interpreter_death_restarts_the_session(
    service: PythonExecutorService, sid: str, code: str, returncode: int
) -> None:
    service.execute("kept = 1", session_id=sid)
    result = service.execute(f"print('before')\n{code}", session_id=sid)
    assert not result.success and result.returncode == returncode
    assert result.restarted and result.state_lost and not result.timed_out
    assert result.stdout == "before\n"  # partial output survives the death
    assert "InterpreterExit" in result.stderr
    after = service.execute("print('kept' in globals())", session_id=sid)
    assert after.success and after.stdout == "False\n" and not after.restarted
    service.close_session(sid)


def test_keyboard_interrupt_is_a_user_error(service: PythonExecutorService, sid: str) -> None:
    result = service.execute("kept = 1\nraise KeyboardInterrupt", session_id=sid)
    assert not result.success and not result.timed_out and not result.restarted
    assert result.exception is not None and result.exception.type == "KeyboardInterrupt"
    assert service.execute("print(kept)", session_id=sid).stdout == "1\n"
    service.close_session(sid)


def test_broken_stdio_is_repaired(service: PythonExecutorService, sid: str) -> None:
    code = "import sys, io\nsys.stdout = io.StringIO()\nsys.stderr = None\nprint('lost')"
    assert service.execute(code, session_id=sid).success
    assert service.execute("print('back')", session_id=sid).stdout == "back\n"
    service.execute("import sys\nsys.stdout.close()", session_id=sid)
    assert service.execute("print('again')", session_id=sid).stdout == "again\n"
    closed = service.execute("import os\nos.close(1)\nos.close(2)\nkept = 2", session_id=sid)
    assert closed.success
    result = service.execute("import os\nos.write(1, b'fd\\n')\nprint(kept)", session_id=sid)
    assert result.stdout == "fd\n2\n"
    service.close_session(sid)


def test_timeout_kills_and_restarts(service: PythonExecutorService, sid: str) -> None:
    service.execute("kept = 1", session_id=sid)
    result = service.execute(
        "print('start', flush=True)\nwhile True: pass", session_id=sid, timeout=0.5
    )
    assert result.timed_out and not result.success and result.returncode == -1
    assert result.restarted and result.exception is not None
    assert result.exception.type == "TimeoutError" and result.stdout == "start\n"
    assert 0.4 < result.duration < 5
    after = service.execute("print('kept' in globals())", session_id=sid)
    assert after.stdout == "False\n" and not after.timed_out
    service.close_session(sid)


def test_timeout_with_cpu_burning_threads_and_blocked_signals(
    service: PythonExecutorService,
) -> None:
    code = (
        "import signal, threading\n"
        "signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})\n"
        "def burn():\n    while True: pass\n"
        "for _ in range(3):\n    threading.Thread(target=burn, daemon=False).start()\n"
        "burn()"
    )
    result = service.execute(code, timeout=0.5)
    assert result.timed_out and result.duration < 5
    assert service.execute("print(1)").stdout == "1\n"


def test_fresh_timeout_does_not_claim_state_loss(service: PythonExecutorService) -> None:
    result = service.execute("import time\ntime.sleep(30)", timeout=0.3)
    assert result.timed_out and not result.restarted


def _spawn_marked(marker: str, *, double_fork: bool) -> str:
    """Snippet starting sleepers carrying ``marker``; returns once each has exec'd."""
    code = (
        "import os, subprocess, sys\n"
        "argv = [sys.executable, '-c', 'import os, time; os.write(1, b\"u\"); time.sleep(60)',"
        f" '{marker}']\n"
        "r, w = os.pipe()\n"
        "subprocess.Popen(argv, start_new_session=True, stdout=w)\n"
        "expected = 1\n"
    )
    if double_fork:
        code += (
            "expected = 2\n"
            "if os.fork() == 0:\n"
            "    os.setsid()\n"
            "    if os.fork() == 0:\n"
            "        os.dup2(w, 1)\n"
            "        os.execv(sys.executable, argv)\n"
            "    os._exit(0)\n"
            "os.wait()\n"
        )
    code += (
        "os.close(w)\n"
        "seen = b''\n"
        "while len(seen) < expected:\n"
        "    seen += os.read(r, 8)\n"
        "print('spawned')\n"
    )
    return code


def test_orphans_and_double_forks_die_with_the_session(
    service: PythonExecutorService, sid: str, marker: str
) -> None:
    code = _spawn_marked(marker, double_fork=True)
    assert service.execute(code, session_id=sid).stdout == "spawned\n"
    from tests.python.conftest import processes_with

    assert len(processes_with(marker)) == 2
    service.close_session(sid)
    assert wait_until_gone(marker, within=5.0) == []


def test_timeout_kills_descendants(service: PythonExecutorService, marker: str) -> None:
    code = (
        "import subprocess, sys, time\n"
        f"subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)', '{marker}'],\n"
        "                 start_new_session=True)\n"
        "time.sleep(60)"
    )
    result = service.execute(code, timeout=1.0)
    assert result.timed_out
    assert wait_until_gone(marker, within=2.0) == []


def test_forked_child_returning_does_not_answer(service: PythonExecutorService, sid: str) -> None:
    # a child forked by user code falls back into the worker loop: it must not reply. The
    # parent waits for it: a child still printing after the call ended would write into the
    # next call's output (as any background process of the session may)
    code = "import os\npid = os.fork()\nprint('hi', flush=True)\nif pid:\n    os.waitpid(pid, 0)"
    result = service.execute(code, session_id=sid)
    assert result.success and "hi" in result.stdout
    assert service.execute("print('next')", session_id=sid).stdout == "next\n"
    service.close_session(sid)


def test_forged_frames_on_the_channel_restart_the_session(
    service: PythonExecutorService, sid: str
) -> None:
    # user code can reach the channel (same process): garbage must not desynchronise it
    code = (
        "import os, socket, stat\n"
        "for fd in range(3, 64):\n"
        "    try:\n"
        "        if stat.S_ISSOCK(os.fstat(fd).st_mode):\n"
        "            os.write(fd, b'\\xff' * 64)\n"
        "    except OSError:\n"
        "        pass\n"
        "kept = 1"
    )
    result = service.execute(code, session_id=sid)
    assert not result.success and result.restarted
    after = service.execute("print('kept' in globals())", session_id=sid)
    assert after.success and after.stdout == "False\n"
    service.close_session(sid)


def test_fresh_run_leaves_no_daemon_behind(service: PythonExecutorService, marker: str) -> None:
    from tests.python.conftest import processes_with

    assert service.execute(_spawn_marked(marker, double_fork=False)).stdout == "spawned\n"
    assert len(processes_with(marker)) <= 1  # it may already be gone
    # the finished interpreter is discarded in the background: its tree goes with it
    assert wait_until_gone(marker, within=5.0) == []


@pytest.mark.parametrize(
    "code",
    [
        "import os\nfor fd in range(3, 64):\n    try:\n        os.close(fd)\n    except OSError:\n"
        "        pass",
        "import json\njson.dumps = lambda *a, **k: 'garbage'",
        "import os\nos.write = None",
    ],
    ids=["closes-every-fd", "breaks-json", "breaks-os-write"],
)
def test_code_breaking_the_worker_machinery(
    service: PythonExecutorService, sid: str, code: str
) -> None:
    result = service.execute(f"kept = 1\n{code}", session_id=sid)
    if result.restarted:  # the worker could not answer: a clear failure, state lost
        assert not result.success and result.exception is not None
        assert "InterpreterExit" in result.stderr
    after = service.execute("print('ok')", session_id=sid)
    assert after.success and after.stdout == "ok\n", after
    service.close_session(sid)


def test_after_reply_hook_runs_once_between_calls(service: PythonExecutorService, sid: str) -> None:
    # what a call leaves under AFTER_REPLY runs after its reply, before the next call
    hook = f"ran = []\n{AFTER_REPLY} = lambda: ran.append(len(ran))\nprint(ran)"
    assert service.execute(hook, session_id=sid).stdout == "[]\n"
    assert service.execute("print(ran)", session_id=sid).stdout == "[0]\n"
    after = service.execute(f"print(ran, {AFTER_REPLY!r} in globals())", session_id=sid)
    assert after.stdout == "[0] False\n" and not after.restarted


def test_after_reply_hook_that_raises_ends_the_session(
    service: PythonExecutorService, sid: str
) -> None:
    assert service.execute(f"x = 1\n{AFTER_REPLY} = lambda: 1 / 0", session_id=sid).success
    # the next call finds the interpreter gone (EXIT_BROKEN) and says so; then a fresh one
    after = service.execute("print(globals().get('x'))", session_id=sid)
    assert after.restarted and not after.success and "status 70" in after.stderr, after
    fresh = service.execute("print(globals().get('x'))", session_id=sid)
    assert fresh.success and fresh.stdout == "None\n", fresh
