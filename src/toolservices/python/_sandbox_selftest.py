"""A minimal fork server for checking the sandbox layers directly.

Parent side, :func:`run_snippets` starts this file under a
:func:`plan_server_launch` plan and sends it a list of snippets. Server side
(``python -I -S _sandbox_selftest.py``, stdlib only), it forks one session per
snippet exactly the way the executor's fork server does: the child calls
``enter_session`` in a fresh workdir, runs the snippet with stdout and stderr
on a pipe, and the server collects the output under a wall-clock deadline,
kills the session's process group and deletes the workdir.

Used by the isolation tests and by ``toolservices sandbox-check``; it is not
the execution service.
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import time
import traceback
from typing import Any

SELFTEST_PY = os.path.abspath(__file__)
_MAX_OUTPUT = 1 << 16


def _run_one(code: str, timeout: float, base: str, index: int) -> dict[str, Any]:
    from _sandbox_session import enter_session, remove_tree

    workdir = os.path.join(base, f"s{index}-{os.getpid()}")
    os.mkdir(workdir, 0o700)
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # the session
        code_status = 0
        try:
            os.close(read_fd)
            devnull = os.open(os.devnull, os.O_RDONLY)
            os.dup2(devnull, 0)
            os.dup2(write_fd, 1)
            os.dup2(write_fd, 2)
            enter_session(workdir=workdir)
            exec(compile(code, "<snippet>", "exec"), {"__name__": "__main__"})
        except SystemExit as exc:
            code_status = exc.code if isinstance(exc.code, int) else 1
        except BaseException:  # noqa: BLE001 - the snippet's failure is its output
            traceback.print_exc()
            code_status = 1
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code_status)
    os.close(write_fd)
    output = bytearray()
    pidfd = os.pidfd_open(pid)  # readable once the session exits: no polling of waitpid
    watched = [read_fd, pidfd]
    deadline = time.monotonic() + timeout
    exited_at: float | None = None
    status: int | None = None
    while watched:
        # after the session exits, give descendants holding the pipe 0.2 s to finish
        limit = deadline if exited_at is None else min(deadline, exited_at + 0.2)
        remaining = limit - time.monotonic()
        if remaining <= 0:
            break
        ready, _, _ = select.select(watched, [], [], remaining)
        if pidfd in ready:
            status = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
            exited_at = time.monotonic()
            watched.remove(pidfd)
        if read_fd in ready:
            chunk = os.read(read_fd, 65536)
            if not chunk:
                watched.remove(read_fd)  # every writer is gone; wait for the exit only
            elif len(output) < _MAX_OUTPUT:
                output += chunk[: _MAX_OUTPUT - len(output)]
    os.close(pidfd)
    timed_out = status is None
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    if status is None:
        status = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
    os.close(read_fd)
    remove_tree(workdir)
    return {"output": output.decode(errors="replace"), "status": status, "timed_out": timed_out}


def serve() -> None:
    sys.path.insert(0, os.path.dirname(SELFTEST_PY))
    request = json.loads(sys.stdin.read())
    base = os.environ.get("TOOLSERVICES_WORKDIR_BASE") or "/tmp"
    results = {}
    for index, (name, snippet) in enumerate(request["snippets"].items()):
        results[name] = _run_one(snippet["code"], snippet.get("timeout", 10.0), base, index)
    sys.stdout.write(json.dumps(results))


def run_snippets(
    config: Any,
    snippets: dict[str, dict[str, Any]],
    *,
    python: str = sys.executable,
    timeout: float = 120.0,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Run each snippet in its own sandboxed session; return (report, results by name).

    Each result has ``output`` (stdout and stderr together), ``status`` and
    ``timed_out``. The server is started and shut down here, and the plan
    closed, so no process of the run survives this call.
    """
    from toolservices.python._sandbox import plan_server_launch

    plan = plan_server_launch(config, python=python, argv=["-I", "-S", SELFTEST_PY])
    try:
        proc = subprocess.Popen(
            plan.argv,
            env=plan.env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
        try:
            out, err = proc.communicate(
                json.dumps({"snippets": snippets}).encode(), timeout=timeout
            )
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        if proc.returncode != 0:
            raise RuntimeError(
                f"selftest server failed ({proc.returncode}): "
                f"{err.decode(errors='replace')[-2000:]}"
            )
        return plan.report, json.loads(out)
    finally:
        plan.close()


if __name__ == "__main__":
    if sys.argv[1:] == ["--driver"]:  # parent side in a separate (e.g. unprivileged) process
        from toolservices.python._sandbox import SandboxConfig

        job = json.loads(sys.stdin.read())
        report, results = run_snippets(SandboxConfig(**job["config"]), job["snippets"])
        sys.stdout.write(json.dumps({"report": report, "results": results}))
    else:
        serve()
