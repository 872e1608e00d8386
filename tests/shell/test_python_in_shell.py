"""The Python tool in a shell session (``ShellService.run_python``, ``python_tool(shell=...)``).

Real sessions, real interpreters, real servers: a file one tool writes the other
sees, both run in one directory, environment and network namespace, a Python
timeout kills only Python's work, and ``fork_session`` copies start a fresh
interpreter that says so. The image side (the image's own python3) is in
tests/images/test_one_environment.py.
"""

from __future__ import annotations

import json

import pytest
from tests._chat import hermes

from toolservices import Episode, ToolRegistry, UserError, python_tool, shell_tools
from toolservices.python import PythonExecutorService
from toolservices.shell import ShellService


def test_files_written_by_one_tool_are_seen_by_the_other(shell: ShellService, sid: str) -> None:
    wrote = shell.run_python(
        "import os\nopen('from_python.txt', 'w').write('py\\n')\nprint(os.getcwd())",
        session_id=sid,
    )
    assert wrote.success, wrote
    seen = shell.run("cat from_python.txt; pwd; echo sh > from_bash.txt", session_id=sid)
    assert seen.stdout == f"py\n{wrote.stdout}", seen
    back = shell.run_python("print(open('from_bash.txt').read(), end='')", session_id=sid)
    assert back.stdout == "sh\n", back
    assert shell.read_file("from_python.txt", session_id=sid) == "py\n"


def test_state_persists_and_the_result_is_the_executors(shell: ShellService, sid: str) -> None:
    assert shell.run_python("x = 41", session_id=sid).success
    ok = shell.run_python("print(x + 1)", session_id=sid)
    assert (ok.success, ok.stdout, ok.returncode, ok.restarted) == (True, "42\n", 0, False)
    assert ok.session_id == sid and ok["stdout"] == "42\n"  # reads as the contract's dict
    failed = shell.run_python("1 / 0", session_id=sid)
    assert not failed.success and failed.returncode == 1
    assert failed.exception is not None and failed.exception.type == "ZeroDivisionError"
    assert "ZeroDivisionError" in failed.stderr
    assert shell.run_python("print(x)", session_id=sid).stdout == "41\n"  # still there


def test_directory_environment_and_tmp_are_the_sessions(shell: ShellService, sid: str) -> None:
    shell.run("echo shared > /tmp/t.txt", session_id=sid)
    py = shell.run_python(
        "import os\nprint(os.getcwd(), os.environ['HOME'], os.environ['PATH'])\n"
        "print(open('/tmp/t.txt').read(), end='')",
        session_id=sid,
    )
    sh = shell.run('echo "$PWD $HOME $PATH"', session_id=sid)
    assert py.stdout == sh.stdout + "shared\n", (py, sh)


def test_both_tools_share_the_sessions_loopback(shell: ShellService, sid: str) -> None:
    layer = shell.isolation_report()["layers"]["network"]
    if not layer["active"] or "loopback" not in layer.get("detail", ""):
        pytest.skip(f"no per-session network namespaces here: {layer}")
    # bash starts a server that writes its port to a fifo once it listens (a rendezvous)
    shell.write_file(
        "server.py",
        "import socket\ns = socket.socket(); s.bind(('127.0.0.1', 0)); s.listen()\n"
        "open('ready', 'w').write(str(s.getsockname()[1]) + '\\n')\n"
        "while True:\n    c, _ = s.accept(); c.sendall(b'hello from bash\\n'); c.close()\n",
        session_id=sid,
    )
    started = shell.run(
        "mkfifo ready && (python3 server.py >/dev/null 2>&1 &) && read port < ready && echo $port",
        session_id=sid,
    )
    port = int(started.stdout)
    talk = shell.run_python(
        f"import socket\nc = socket.create_connection(('127.0.0.1', {port}), timeout=5)\n"
        "print(c.recv(100).decode(), end='')",
        session_id=sid,
    )
    assert talk.stdout == "hello from bash\n", talk
    other = shell.run_python(
        "import socket\ns = socket.socket(); s.settimeout(5)\n"
        f"print(s.connect_ex(('127.0.0.1', {port})))",
        session_id=sid + "-other",
    )
    assert other.stdout.strip() != "0", other  # another session has its own loopback
    shell.close_session(sid + "-other")


def test_a_timeout_kills_only_pythons_work(shell: ShellService, sid: str) -> None:
    shell.run("echo keep > kept.txt; export MARK=1", session_id=sid)
    job = shell.run("(sleep 300 &) ; echo started", session_id=sid)
    assert job.stdout == "started\n"
    shell.run_python("x = 1", session_id=sid)
    slow = shell.run_python(
        "import subprocess, time\nsubprocess.Popen(['sleep', '300'])\nprint('before')\n"
        "time.sleep(300)",
        session_id=sid,
        timeout=1.0,
    )
    assert slow.timed_out and slow.restarted and not slow.success, slow
    assert slow.stdout == "before\n"  # output up to the kill is kept
    assert slow.exception is not None and slow.exception.type == "TimeoutError"
    assert "the shell session, its files and its processes go on" in slow.stderr
    after = shell.run("cat kept.txt; echo $MARK; pgrep -c -x sleep", session_id=sid)
    # the shell's state and its own background sleep survive; Python's sleep is gone
    assert after.stdout == "keep\n1\n1\n", after
    fresh = shell.run_python("print('x' in globals())", session_id=sid)
    assert (fresh.stdout, fresh.restarted) == ("False\n", False), fresh


def test_an_interpreter_that_exits_is_reported_and_replaced(shell: ShellService, sid: str) -> None:
    shell.run_python("x = 1", session_id=sid)
    ended = shell.run_python("import os\nos._exit(3)", session_id=sid)
    assert (ended.success, ended.returncode, ended.restarted) == (False, 3, True), ended
    assert ended.exception is not None and ended.exception.type == "InterpreterExit"
    assert "exited with status 3" in ended.stderr
    clean = shell.run_python("import os\nos._exit(0)", session_id=sid)
    assert clean.success and clean.restarted  # a clean exit, as in the executor
    assert shell.run_python("print(1)", session_id=sid).stdout == "1\n"
    assert shell.run("echo alive", session_id=sid).stdout == "alive\n"


def test_python_cannot_reach_the_supervisor(shell: ShellService, sid: str) -> None:
    """Neither its descriptors nor its memory (where its replies go), nor a signal."""
    reach = shell.run_python(
        "import os\nfor path in ('fd', 'mem'):\n    try:\n"
        "        os.listdir(f'/proc/{os.getppid()}/fd') if path == 'fd' else "
        "open(f'/proc/{os.getppid()}/mem', 'rb')\n"
        "        print(path, 'open')\n"
        "    except PermissionError:\n        print(path, 'denied')\n",
        session_id=sid,
    )
    assert reach.stdout == "fd denied\nmem denied\n", reach
    if not shell.isolation_report()["layers"]["command_scope"]["active"]:
        pytest.skip("no Landlock signal scoping on this kernel")
    tried = shell.run_python(
        "import os, signal\ntry:\n    os.kill(os.getppid(), signal.SIGKILL)\n"
        "except PermissionError as exc:\n    print('refused', exc.errno)\n",
        session_id=sid,
    )
    assert tried.stdout == "refused 1\n", tried
    assert shell.run("echo alive", session_id=sid).stdout == "alive\n"


def test_fork_copies_files_and_starts_a_fresh_interpreter(shell: ShellService, sid: str) -> None:
    shell.run_python("x = 5\nopen('data.txt', 'w').write('copied')", session_id=sid)
    [copy] = shell.fork_session(sid, 1)
    try:
        first = shell.run_python(
            "print(open('data.txt').read(), 'x' in globals())", session_id=copy
        )
        assert (first.stdout, first.restarted) == ("copied False\n", True), first
        assert not shell.run_python("pass", session_id=copy).restarted  # said once
        assert shell.run_python("print(x)", session_id=sid).stdout == "5\n"  # the source runs on
    finally:
        shell.close_session(copy)
    # a source that never ran Python: its copies' Python is simply new
    shell.run("true", session_id=sid + "-sh")
    [plain] = shell.fork_session(sid + "-sh", 1)
    assert not shell.run_python("pass", session_id=plain).restarted
    for session in (plain, sid + "-sh"):
        shell.close_session(session)


def test_without_a_session_the_code_runs_in_a_fresh_one(shell: ShellService) -> None:
    res = shell.run_python("import os\nprint(len(os.listdir('.')))")
    assert (res.success, res.stdout, res.session_id, res.restarted) == (True, "0\n", None, False)


def test_bad_arguments_are_user_errors(shell: ShellService) -> None:
    with pytest.raises(UserError, match="code must be a str"):
        shell.run_python(b"print(1)")  # type: ignore[arg-type]
    with pytest.raises(UserError, match="timeout"):
        shell.run_python("pass", timeout=0)
    with pytest.raises(UserError, match="session_id"):
        shell.run_python("pass", session_id="")
    with pytest.raises(UserError, match="one of executor= .* or shell="):
        python_tool()
    with PythonExecutorService(pool_size=1) as executor:
        with pytest.raises(UserError, match="one of executor="):
            python_tool(executor, shell=shell)
        with pytest.raises(UserError, match="needs a ShellService"):
            python_tool(shell=executor)  # type: ignore[arg-type]


def test_output_is_capped_like_the_executors(sid: str) -> None:
    with ShellService(pool_size=1, timeout=10.0, max_output=1000) as small:
        res = small.run_python("print('a' * 5000)", session_id=sid)
    assert res.truncated and res.stdout.startswith("a" * 1000), res.stdout[:50]
    assert "4001 more bytes not shown" in res.stdout


async def test_an_episode_with_both_tools_shares_one_environment(shell: ShellService) -> None:
    tools = [python_tool(shell=shell), *shell_tools(shell)]
    async with Episode(tools, max_turns=None) as episode:
        assert episode.shell is shell and episode.python is None
        await episode.astep(
            hermes("python", {"code": "open('answer.txt', 'w').write(str(6 * 7))\nv = 1"})
        )
        messages = await episode.astep(hermes("bash", {"command": "cat answer.txt"}))
        assert messages[-1]["content"] == "42", messages
        messages = await episode.astep(
            hermes(
                "python",
                {
                    "code": "import subprocess\nprint(subprocess.run(['ls'], "
                    "capture_output=True, text=True).stdout, v)"
                },
            )
        )
        assert messages[-1]["content"] == "answer.txt\n 1\n", messages
        [twin] = await episode.afork(1)
        async with twin:
            messages = await twin.astep(
                hermes("python", {"code": "print(open('answer.txt').read())"})
            )
            assert "42" in messages[-1]["content"]
            assert "the interpreter was restarted" in messages[-1]["content"]
        session = episode.shell_session
    assert session is not None
    assert shell.run_python("print('v' in globals())", session_id=session).stdout == "False\n"
    shell.close_session(session)


def test_the_models_schema_does_not_change(shell: ShellService) -> None:
    with PythonExecutorService(pool_size=1) as executor:
        on_executor, on_shell = python_tool(executor), python_tool(shell=shell)
        assert on_shell.schema_in == on_executor.schema_in
        assert on_shell.description == on_executor.description
        specs = [json.dumps(ToolRegistry([t]).openai_specs()) for t in (on_shell, on_executor)]
        assert specs[0] == specs[1]


def test_a_closed_pipe_is_an_exception_as_in_python(shell: ShellService, sid: str) -> None:
    res = shell.run_python(
        "import os\nr, w = os.pipe()\nos.close(r)\ntry:\n    os.write(w, b'x')\n"
        "except BrokenPipeError:\n    print('BrokenPipeError')",
        session_id=sid,
    )
    assert res.stdout == "BrokenPipeError\n", res


def test_garbage_on_its_channel_restarts_only_the_interpreter(
    shell: ShellService, sid: str
) -> None:
    """Code that writes on its own channel cannot pass for a result: the interpreter is
    replaced, the call says so, the shell and the next Python call are fine."""
    shell.run_python("x = 1", session_id=sid)
    forged = shell.run_python(
        "import os, socket\nfor fd in range(3, 64):\n    try:\n"
        "        s = socket.socket(fileno=os.dup(fd))\n    except OSError:\n        continue\n"
        "    try:\n        s.send(b'\\xff' * 64)\n    except OSError:\n        pass\n"
        "    s.detach()\nimport time\ntime.sleep(2)",
        session_id=sid,
    )
    assert not forged.success and forged.restarted, forged
    assert forged.exception is not None and forged.exception.type == "InterpreterExit", forged
    assert "protocol violation" in forged.stderr, forged
    assert shell.run_python("print('x' in globals())", session_id=sid).stdout == "False\n"
    assert shell.run("echo alive", session_id=sid).stdout == "alive\n"
