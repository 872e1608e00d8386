"""A minimal session runner for checking the sandbox layers directly (runtime side).

Started by :func:`toolservices.python.sandbox._snippets.run_snippets` under a
:func:`plan_server_launch` plan (``python -I -S runtime/_snippets.py``), it
forks one session per snippet with :func:`fork_confined`, exactly the way the
fork server does, runs the snippet with stdout and stderr on a pipe, collects
the output under a wall-clock deadline, kills the session's process group and
deletes the workdir.

Used by the isolation tests, which check each layer without the executor's
machinery in the way; ``toolservices sandbox-check --self-test`` runs through
the executor itself (``sandbox/_selftest.py``).
"""

from __future__ import annotations

if __name__ == "__main__" and not __package__:  # started by path (the only way it runs)
    import sys  # (-I leaves the script's directory off sys.path)

    sys.path.insert(0, __file__.rpartition("/")[0])
    import _bootstrap  # noqa: F401

import json
import os
import select
import signal
import sys
import time
import traceback
from typing import Any

from ._confine import fork_confined, remove_tree

_MAX_OUTPUT = 1 << 16


def _run_one(code: str, timeout: float, base: str, index: int) -> dict[str, Any]:
    workdir = os.path.join(base, f"s{index}-{os.getpid()}")
    os.mkdir(workdir, 0o700)
    read_fd, write_fd = os.pipe()

    def prepare() -> None:
        os.close(read_fd)
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)
        os.dup2(write_fd, 1)
        os.dup2(write_fd, 2)

    def failed(exc: BaseException) -> None:  # the set-up's failure is the snippet's output
        traceback.print_exception(type(exc), exc, exc.__traceback__)
        sys.stderr.flush()

    pid = fork_confined(workdir, prepare=prepare, failed=failed)
    if pid == 0:  # the session
        code_status = 0
        try:
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
    request = json.loads(sys.stdin.read())
    base = os.environ.get("TOOLSERVICES_WORKDIR_BASE") or "/tmp"
    results = {}
    for index, (name, snippet) in enumerate(request["snippets"].items()):
        results[name] = _run_one(snippet["code"], snippet.get("timeout", 10.0), base, index)
    sys.stdout.write(json.dumps(results))


if __name__ == "__main__":
    serve()
