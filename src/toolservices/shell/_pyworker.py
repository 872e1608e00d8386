"""The Python tool's interpreter inside a shell session (session side, standard library only).

Sent to the session with ``_supervisor`` (as ``_toolservices_shell_python``)
and called by it for the ``python*`` requests. The interpreter is a child of
the supervisor, so it shares everything the session is: the root (an image's
overlay and writable layer), the workspace, ``/tmp``, the network and PID
namespaces, the disk quota and the process budget. It is the executor's own
session worker (``_worker.serve_session``: fresh ``__main__`` globals, output
captured in two memfds it hands over in ``HELLO``, one ``RESULT`` frame per
``EXEC`` with a random sequence number), started once and kept between calls:

* without an image, forked from the supervisor itself (the same interpreter
  as the executor's sessions, already loaded: no start-up cost);
* on an image, the image's own ``python3`` running the runtime from a sealed
  zip in a memfd (``_imagepy``; the host sends the zip once per session,
  since the image's root has neither the runtime's files nor ``zipfile``).

It runs in a Landlock domain of its own scoped for signals (as the shell's
spawner does), with the environment and starting directory of the session's
commands. A call past its time limit kills the interpreter and everything
it started, and nothing else: the shell, its background jobs and its state
go on. The next call starts a fresh interpreter; the call that lost the
state says so (``restarted``), and so does the first call of a
``fork_session`` copy (an interpreter cannot be copied into another
session's namespaces).
"""

from __future__ import annotations

import base64
import ctypes
import errno
import fcntl
import gc
import importlib
import json
import os
import resource
import select
import signal
import socket
import sys
import time
from typing import Any

_RUNTIME = "_toolservices_runtime"
_PR_SET_DUMPABLE = 4
#: seconds an interpreter gets to say HELLO (an image's python3 imports the runtime first)
START_WAIT = 30.0
#: the largest RESULT frame accepted (a result is a few hundred bytes of JSON)
_MAX_RESULT = 1 << 20
#: what a start failure keeps of the interpreter's own error output
_MAX_START_ERROR = 4000
#: seconds an interpreter that closed its channel gets to finish exiting
_EXIT_WAIT = 2.0
#: the child's descriptors: the channel and (image) the runtime zip
_CHAN_FD, _ZIP_FD = 3, 4


def _runtime(name: str) -> Any:
    """A module of the executor's runtime: the session's copy, or (tests on the host) ours."""
    module = sys.modules.get(f"{_RUNTIME}.{name}")
    if module is None:
        module = importlib.import_module(f"toolservices.python.runtime.{name}")
    return module


def _shell_module(name: str) -> Any:
    module = sys.modules.get(f"_toolservices_shell_{name}")
    if module is None:
        module = importlib.import_module(f"toolservices.shell._{name}")
    return module


class StartError(Exception):
    """The interpreter could not be started; the message says why, for the model."""


class _Worker:
    """One live interpreter: its pid (and pidfd), channel and output memfds."""

    def __init__(self, pid: int, pidfd: int, chan: socket.socket, out_fd: int, err_fd: int):
        self.pid, self.pidfd, self.chan = pid, pidfd, chan
        self.out_fd, self.err_fd = out_fd, err_fd
        self.seq = 0

    def exited(self) -> bool:
        return bool(_readable([self.pidfd], 0.0))

    def kill(self) -> int | None:
        """Kill the interpreter and every process below it; its exit status if we reaped it."""
        status = _end(self.pid, self.pidfd)
        self.chan.close()
        for fd in (self.out_fd, self.err_fd):
            os.close(fd)
        return status


class Interpreter:
    """The session's Python tool: at most one live interpreter, started on first use."""

    def __init__(self) -> None:
        self.worker: _Worker | None = None
        self.zip_fd = -1
        #: the next call reports that earlier state is gone (a fork_session copy)
        self.lost = False
        #: whether an interpreter ever ran here (a new one after it is a restart)
        self.started = False

    # --- start --------------------------------------------------------------------

    def _start(self, shell: Any, config: dict[str, Any], begun: float, limit: float) -> _Worker:
        python = config.get("python")  # None: no image (fork ourselves); "": none in the image
        if python == "":
            raise StartError(
                "this session's image has no python3 on its PATH, so the python tool cannot "
                "run here; use the shell tool (bash) instead"
            )
        if python and self.zip_fd < 0:
            raise _NeedRuntime
        parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        err_r, err_w = os.pipe2(os.O_CLOEXEC)
        env = _shell_module("terminal").command_env(dict(os.environ), shell.home, shell.offline)
        start = config.get("start_dir") or shell.workspace
        try:
            pid = os.fork()
        except OSError as exc:
            for end in (parent, child):
                end.close()
            os.close(err_r)
            os.close(err_w)
            raise StartError(f"cannot start the interpreter: {exc.strerror or exc}") from None
        if pid == 0:  # pragma: no cover - the interpreter's child
            _child(child.fileno(), err_w, self.zip_fd, python, start, env, config)
        child.close()
        os.close(err_w)
        pidfd = os.pidfd_open(pid)
        try:
            wait = min(START_WAIT, max(begun + limit - time.monotonic(), 0.001))
            out_fd, err_fd = _hello(parent, pidfd, err_r, python, wait)
        except StartError:
            _end(pid, pidfd)
            parent.close()
            raise
        finally:
            os.close(err_r)
        self.started = True
        return _Worker(pid, pidfd, parent, out_fd, err_fd)

    # --- one call -------------------------------------------------------------------

    def run(self, shell: Any, config: dict[str, Any], code: str, timeout: float) -> dict[str, Any]:
        begun = time.monotonic()
        restarted = self.lost
        worker = self.worker
        if worker is not None and worker.exited():  # it ended between calls (a thread's exit)
            worker.kill()
            worker = self.worker = None
            restarted = True
        if worker is None:  # the call's limit covers starting it (the host waits that long)
            worker = self.worker = self._start(shell, config, begun, timeout)
        self.lost = False
        cap = int(config["max_output"])
        seq = _runtime("_protocol").new_seq(worker.seq)
        worker.seq = seq
        outcome, result = _exchange(worker, seq, code, begun + timeout)
        reply: dict[str, Any] = {"ok": True, "restarted": restarted, "limit": timeout}
        if outcome == "result":
            reply.update(
                rc=int(result.get("rc", 0)),
                exc=result.get("exc"),
                dur=float(result.get("dur", 0.0)),
                dropped=list(result.get("dropped", [0, 0])),
            )
            if result.get("fatal"):  # the code broke the worker's machinery: it exits
                outcome = f"the interpreter's machinery broke: {result['fatal']}"
        reply["timed_out"] = outcome == "timeout"
        for name, fd in (("stdout", worker.out_fd), ("stderr", worker.err_fd)):
            size = os.fstat(fd).st_size
            reply[name] = base64.b64encode(os.pread(fd, min(size, cap), 0)).decode()
            reply[f"{name}_total"] = size
        if outcome != "result":
            status = worker.kill()
            self.worker = None
            if outcome == "exit":
                reply["status"] = status
                outcome = _describe(status)
            if outcome != "timeout":
                reply["problem"] = outcome
            reply["restarted"] = True  # this call lost the interpreter's state
            reply["dur"] = time.monotonic() - begun
        return reply

    def forget(self) -> None:
        """A ``fork_session`` copy: no interpreter, and its first call says the state is gone."""
        if self.worker is not None:
            self.worker.kill()
            self.worker = None
        self.lost = True


class _NeedRuntime(Exception):
    """The session has no runtime zip yet: the host sends it with the next request."""


def _child(
    chan: int,
    err_w: int,
    zip_fd: int,
    python: str | None,
    start: str,
    env: dict[str, str],
    config: dict[str, Any],
) -> None:  # pragma: no cover - runs in the interpreter's process, which never returns
    """In the forked child: descriptors, directory, environment, domain; then serve."""
    try:
        gc.freeze()  # the supervisor's objects stay as they are: none is collected here
        os.setpgid(0, 0)
        for signum in (signal.SIGCHLD, signal.SIGTERM):  # SIGPIPE stays ignored, as in Python
            signal.signal(signum, signal.SIG_DFL)
        null = os.open(os.devnull, os.O_RDWR)
        high = [fcntl.fcntl(fd, fcntl.F_DUPFD, 64) for fd in (null, err_w, chan, zip_fd) if fd >= 0]
        os.dup2(high[0], 0)
        os.dup2(high[0], 1)
        os.dup2(high[1], 2)
        os.dup2(high[2], _CHAN_FD, inheritable=False)
        if zip_fd >= 0:
            os.dup2(high[3], _ZIP_FD, inheritable=False)
        os.closerange(_ZIP_FD + 1 if zip_fd >= 0 else _CHAN_FD + 1, 1 << 20)
        try:
            os.chdir(start)
        except OSError:
            try:
                os.makedirs(start, exist_ok=True)  # an image's WorkingDir it lacks, as bash does
                os.chdir(start)
            except OSError:
                pass  # the workspace is where we are already
        os.environ.clear()
        os.environ.update(env)
        # the session's stack, as the executor's interpreters have (the supervisor lowered
        # the soft limit for the commands: see _terminal.command_limits)
        hard = resource.getrlimit(resource.RLIMIT_STACK)[1]
        resource.setrlimit(resource.RLIMIT_STACK, (hard, hard))
        lib = ctypes.CDLL(None, use_errno=True)
        # its own Landlock domain scoped for signals: it cannot signal the supervisor
        _shell_module("spawner").scope_signals(lib)
        max_output = int(config["max_output"])
        if python:
            state = json.dumps(_runtime("_confine")._load_state())
            _runtime("_imagepy").exec_image_python(
                python, _ZIP_FD, _CHAN_FD, max_output=max_output, busy_poll=0.0, state=state
            )
        lib.prctl(_PR_SET_DUMPABLE, 1, 0, 0, 0)  # as any process: its own /proc entries readable
        # the supervisor's streams are its session worker's captures: plain files again
        sys.stdin = open(0, closefd=False)  # noqa: SIM115 - lives with the process
        sys.stdout = open(1, "w", closefd=False)  # noqa: SIM115
        sys.stderr = open(2, "w", closefd=False)  # noqa: SIM115
        sock = socket.socket(fileno=_CHAN_FD)
        _runtime("_worker").serve_session(sock, max_output=max_output, busy_poll=0.0)
    except BaseException as exc:
        try:
            os.write(2, f"{type(exc).__name__}: {exc}\n".encode())
        finally:
            os._exit(71)


def _hello(
    sock: socket.socket, pidfd: int, err_r: int, python: str | None, wait: float
) -> tuple[int, int]:
    """Wait for the interpreter's HELLO; its output memfds, or a StartError saying why not."""
    protocol = _runtime("_protocol")
    ready = _readable([sock.fileno(), pidfd], wait)
    if sock.fileno() in ready:
        sock.settimeout(wait)
        try:
            frame = protocol.recv_frame(sock, max_body=_MAX_RESULT)
        except (OSError, ValueError, protocol.ProtocolViolation):
            frame = None
        if frame is not None:
            fds = list(frame.fds)
            if frame.kind == protocol.Kind.HELLO and len(fds) >= 2:
                for extra in fds[2:]:  # its namespaces (for the executor's spawn_with_files)
                    os.close(extra)
                sock.settimeout(None)
                return fds[0], fds[1]
            for fd in fds:
                os.close(fd)
    os.set_blocking(err_r, False)
    try:
        said = os.read(err_r, _MAX_START_ERROR).decode("utf-8", "replace").strip()
    except OSError:
        said = ""
    what = f"the image's {python}" if python else "the interpreter"
    if not ready:
        within = "its start-up limit" if wait >= START_WAIT else "the call's time limit"
        raise StartError(f"{what} did not start within {within}")
    raise StartError(
        f"{what} ended before it could serve the python tool"
        + (f": {said}" if said else "")
        + (" (the python tool needs CPython 3.10 or newer in the image)" if python else "")
    )


def _exchange(worker: _Worker, seq: int, code: str, deadline: float) -> tuple[str, dict[str, Any]]:
    """Send the code, wait for its RESULT: ("result", fields), ("timeout", {}), ("exit", {})
    (the interpreter ended) or (what went wrong, {})."""
    protocol = _runtime("_protocol")
    body = code.encode("utf-8", "surrogatepass")
    try:
        worker.chan.settimeout(max(deadline - time.monotonic(), 0.001))
        protocol.send_frame(worker.chan, protocol.Kind.EXEC, seq, body)
    except TimeoutError:
        return "timeout", {}
    except OSError:
        return "exit", {}
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            return "timeout", {}
        ready = _readable([worker.chan.fileno(), worker.pidfd], left)
        if worker.chan.fileno() in ready:
            worker.chan.settimeout(max(deadline - time.monotonic(), 0.001))
            try:
                frame = protocol.recv_frame(worker.chan, max_body=_MAX_RESULT)
            except TimeoutError:
                return "timeout", {}
            except protocol.PeerClosed:  # it is exiting: the channel closes before it ends
                ended = _readable([worker.pidfd], _EXIT_WAIT)
                return "exit" if ended else "protocol violation: the channel was closed", {}
            except (OSError, ValueError, protocol.ProtocolViolation):
                return "protocol violation: a broken frame", {}
            for fd in frame.fds:
                os.close(fd)
            if frame.kind != protocol.Kind.RESULT or frame.seq != seq:
                return "protocol violation: a frame that is not this call's result", {}
            try:
                fields = json.loads(frame.body)
            except ValueError:
                fields = None
            if not isinstance(fields, dict):
                return "protocol violation: a malformed result", {}
            return "result", fields
        if worker.pidfd in ready:
            return "exit", {}


def _end(pid: int, pidfd: int) -> int | None:
    """Kill ``pid`` and every process below it, reap them all, close ``pidfd``; ``pid``'s
    exit status if we reaped it. Its processes come back to the supervisor (a subreaper)
    when it dies: they are reaped here, so none lingers as a zombie a command would see."""
    below = [] if _readable([pidfd], 0.0) else _kill_below(pid)
    try:
        signal.pidfd_send_signal(pidfd, signal.SIGKILL)
    except OSError:  # gone already
        pass
    status = None
    try:
        _, raw = os.waitpid(pid, 0)
        status = os.waitstatus_to_exitcode(raw)
    except ChildProcessError:  # the supervisor's reaper collected it first
        pass
    os.close(pidfd)
    _reap(below)
    return status


def _readable(fds: list[int], timeout: float) -> set[int]:
    """Which of ``fds`` are readable (or hung up) within ``timeout`` seconds."""
    poller = select.poll()
    for fd in fds:
        poller.register(fd, select.POLLIN)
    return {fd for fd, _events in poller.poll(max(timeout, 0.0) * 1000)}


def _describe(status: int | None) -> str:
    """How the interpreter ended, from its exit status (None: not known)."""
    if status is None:
        return "the interpreter ended"
    if status < 0:
        try:
            name = signal.Signals(-status).name
        except ValueError:
            name = f"signal {-status}"
        return f"the interpreter was killed by {name}"
    return f"the interpreter exited with status {status}"


def _descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (one scan of ``/proc``: the session's own PID namespace)."""
    children: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat", "rb") as fh:
                    parent = int(fh.read().rsplit(b")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue  # gone already
            children.setdefault(parent, []).append(int(name))
    found: list[int] = []
    pending = [pid]
    while pending:
        kids = children.get(pending.pop(), [])
        found.extend(kids)
        pending.extend(kids)
    return found


def _kill_below(pid: int) -> list[int]:
    """SIGKILL every process below ``pid`` while it lives (a subreaper: orphans stay below
    it), until none is left running; then only ``pid`` itself is left to kill. Returns
    pidfds of every process seen below it, to reap once ``pid`` is gone."""
    seen: dict[int, int] = {}
    for _round in range(16):
        victims = []
        for child in _descendants(pid):
            if child not in seen:
                try:
                    seen[child] = os.pidfd_open(child)
                except OSError:  # gone already
                    continue
            try:
                with open(f"/proc/{child}/stat", "rb") as fh:
                    if fh.read().rsplit(b")", 1)[1].split()[0] == b"Z":
                        continue
            except (OSError, IndexError):
                continue
            victims.append(child)
        if not victims:
            break
        for victim in victims:
            try:
                signal.pidfd_send_signal(seen[victim], signal.SIGKILL)
            except OSError:
                continue
    return list(seen.values())


def _reap(pidfds: list[int]) -> None:
    """Reap the killed processes that came back to us (bounded: SIGKILL ends them at once)."""
    deadline = time.monotonic() + _EXIT_WAIT
    for pidfd in pidfds:
        try:
            if _readable([pidfd], deadline - time.monotonic()):
                os.waitid(os.P_PIDFD, pidfd, os.WEXITED | os.WNOHANG)
        except ChildProcessError:  # not ours (reaped by its own parent first)
            pass
        finally:
            os.close(pidfd)


_interpreter = Interpreter()


def call(op: str, args: dict[str, Any], config: dict[str, Any], shell: Any) -> dict[str, Any]:
    """The supervisor's hook for ``python``, ``python_status`` and ``python_forget``."""
    if op == "python_status":
        live = _interpreter.worker is not None and not _interpreter.worker.exited()
        return {"ok": True, "live": live, "started": _interpreter.started}
    if op == "python_forget":
        _interpreter.forget()
        return {"ok": True}
    if op != "python":
        return {"ok": False, "errno": "EINVAL", "message": f"unknown operation {op!r}"}
    if args.get("runtime") and _interpreter.zip_fd < 0:
        data = base64.b64decode(args["runtime"])
        _interpreter.zip_fd = _runtime("_imagepy").sealed_memfd(data)
    try:
        return _interpreter.run(shell, config, args["code"], float(args["timeout"]))
    except _NeedRuntime:
        return {"ok": False, "errno": "ENOENT", "need_runtime": True, "message": "no runtime"}
    except StartError as exc:
        return {"ok": False, "errno": "ENOEXEC", "message": str(exc)}
    except OSError as exc:
        code = errno.errorcode.get(exc.errno or 0, "EIO")
        return {"ok": False, "errno": code, "message": f"the python tool failed: {exc}"}
