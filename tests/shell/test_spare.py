"""The spare bash: started and given the shell state before its command arrives.

Each command runs in a bash that restored the state while the caller was
away; these tests pin that such a bash never runs a command with a state
other than the newest, and that new sessions (warmed spares) work at once.
"""

from __future__ import annotations

from toolservices.python import PythonExecutorService
from toolservices.shell import ShellService

# reaches the supervisor of a session (it runs there; the test changes its state by hand)
_SUPERVISOR = "__import__('sys').modules['_toolservices_shell']._shell"


def test_state_of_each_command_reaches_the_next(shell: ShellService, sid: str) -> None:
    for i in range(5):  # each result proves the spare had restored the previous state
        res = shell.run(f'echo "${{N:-none}}"; N={i}; cd "$(mktemp -d -p .)"', session_id=sid)
        assert res.stdout == ("none\n" if i == 0 else f"{i - 1}\n"), res
    assert shell.run("basename $(dirname $PWD)", session_id=sid).stdout != "/\n"


def test_a_spare_primed_with_an_older_state_is_not_used(shell: ShellService, sid: str) -> None:
    assert shell.run("X=old", session_id=sid).success
    # the next command's bash has restored X=old by now; change the state behind its back
    change = f"_s = {_SUPERVISOR}; _s.state += 'X=new\\n'; _s.generation += 1"
    res = shell._python.execute(change, session_id=sid)
    assert res.success, res
    assert shell.run('echo "$X"', session_id=sid).stdout == "new\n"


def test_a_killed_spare_is_replaced(shell: ShellService, sid: str) -> None:
    # the command kills every process it can signal: the spare asked for meanwhile too
    res = shell.run("kill -9 -1; true", session_id=sid, timeout=8)
    assert res.returncode == -9 or res.success, res
    assert shell.run("echo next", session_id=sid).stdout == "next\n"


def test_new_sessions_work_from_warmed_spares(shell: ShellService) -> None:
    before = shell.stats()["failures"]
    for i in range(4):  # more sessions than spares: warmed ones and cold ones
        res = shell.run("echo $((6 * 7))", session_id=f"warm-{i}-{id(shell)}")
        assert res.stdout == "42\n" and not res.restarted, res
    # a cold session is told to load the supervisor without a failed call
    assert shell.stats()["failures"] == before


def test_sessions_share_the_supervisor_the_fork_server_loaded() -> None:
    with ShellService(pool_size=1, spares=0) as shell:
        # an interpreter that never ran a shell request has the supervisor's modules
        res = shell._python.execute("import sys\nprint('_toolservices_shell' in sys.modules)")
        assert res.stdout == "True\n", res
        assert shell.run("echo $((6 * 7))", session_id="a").stdout == "42\n"


def test_a_session_that_lost_the_supervisor_loads_it_again(shell: ShellService, sid: str) -> None:
    assert shell.run("echo one", session_id=sid).stdout == "one\n"
    drop = "import sys\nfor n in [n for n in sys.modules if n.startswith('_toolservices_shell')]:"
    drop += "\n    del sys.modules[n]\ndel __ts_shell__"
    assert shell._python.execute(drop, session_id=sid).success
    before = shell.stats()["failures"]
    res = shell.run("echo two", session_id=sid)
    assert res.stdout == "two\n" and shell.stats()["failures"] == before, res


def test_executor_warmup_failure_only_costs_the_spares() -> None:
    with PythonExecutorService(pool_size=1, spares=1, warmup="raise RuntimeError") as py:
        for i in range(3):
            assert py.execute("print(1)", session_id=f"s{i}").stdout == "1\n"


def test_commands_run_with_the_normal_scheduling_policy(shell: ShellService, sid: str) -> None:
    # the spawner runs as SCHED_BATCH (it must not preempt the supervisor); its bashes must not
    for _ in range(2):
        res = shell.run("grep -E '^policy' /proc/$$/sched; nice", session_id=sid)
        assert res.stdout.split()[-2:] == ["0", "0"], res
