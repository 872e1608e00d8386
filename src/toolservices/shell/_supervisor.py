"""The shell supervisor: runs inside a sandboxed Python session, standard library only.

The host never imports this module: it sends its source once to each session
(``ShellService`` execs it there), so it runs with exactly the session's
rights (uid, rlimits, namespaces, Landlock, seccomp). It holds the shell state
of one session (a bash script that restores variables, functions, aliases,
options and the working directory) and, for each command, starts a fresh
``bash`` as its child that first restores that state, then runs the command,
and on exit writes the new state into a private memfd. So:

* the exit status is bash's own exit status, seen by ``waitpid``: nothing the
  command prints, closes or redirects can end it early or fake it;
* ``exit``, ``exec``, ``kill -9 $$`` end only that bash; the next command gets
  a fresh one, restored from the last state saved (``restarted`` says when
  this command's changes could not be saved);
* each bash runs in its own process group and in a nested Landlock domain
  scoped for signals, so it cannot signal this supervisor;
* the result travels back as one JSON line on the session's own stdout,
  which no child can reach (this process is made non-dumpable, so its
  ``/proc/<pid>/fd`` stays closed to the commands).

File operations (``write_file``, ``read_file``, ``list_files``) run here too:
they act with the session's rights and no more.
"""

from __future__ import annotations

import base64
import ctypes
import errno
import json
import os
import select
import signal
import stat
import time
from typing import Any

BASH = "/bin/bash"
_STATE_END = "#toolservices-state-end"
_PR_SET_DUMPABLE = 4
_SYS_LANDLOCK_CREATE_RULESET = 444
_SYS_LANDLOCK_RESTRICT_SELF = 446
_SCOPE_ALL = 3  # abstract unix sockets | signals (Landlock ABI 6)

# The script every bash runs: restore the state (fd 3), then run the command ($1)
# with an EXIT trap that saves the new state into fd 4.
_PRELUDE = r"""
__ts_save() {
  local __ts_v; local -a __ts_names=() __ts_funcs=()
  for __ts_v in $(builtin compgen -v); do
    case $__ts_v in
      BASH|BASHOPTS|BASHPID|BASH_*|EUID|PPID|SHELLOPTS|UID|FUNCNAME|GROUPS) continue ;;
      LINENO|RANDOM|SECONDS|SRANDOM|EPOCHREALTIME|EPOCHSECONDS|_|PIPESTATUS) continue ;;
      DIRSTACK|COMP_*|OPTIND|OPTARG) continue ;;
      HOSTNAME|HOSTTYPE|MACHTYPE|OSTYPE|SHLVL|HISTCMD|PWD|__ts_*) continue ;;
    esac
    [[ ${!__ts_v@a} == *r* ]] && continue
    __ts_names+=("$__ts_v")
  done
  for __ts_v in $(builtin compgen -A function); do
    [[ $__ts_v == __ts_* ]] || __ts_funcs+=("$__ts_v")
  done
  {
    builtin declare -p "${__ts_names[@]}"
    ((${#__ts_funcs[@]})) && builtin declare -f "${__ts_funcs[@]}"
    builtin alias -p
    builtin shopt -p
    builtin set +o
    builtin printf 'builtin cd -- %q 2>/dev/null\n' "$PWD"
    builtin printf '%s\n' '#toolservices-state-end'
  } >/dev/fd/4 2>/dev/null
}
builtin trap __ts_save EXIT
builtin source /dev/fd/3 2>/dev/null
builtin exec 3<&-
__ts_cmd=$1
builtin set --
builtin eval "$__ts_cmd"
"""

_libc: Any = None


def _lib() -> Any:
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(None, use_errno=True)
    return _libc


class _Scope(ctypes.Structure):
    _fields_ = [("fs", ctypes.c_uint64), ("net", ctypes.c_uint64), ("scoped", ctypes.c_uint64)]


class Shell:
    """One session's shell: its saved state, its workspace and its running commands."""

    def __init__(self, workspace: str, *, max_output: int, max_file: int) -> None:
        self.workspace = workspace
        self.max_output = max_output
        self.max_file = max_file
        self.state = ""
        self.pid = os.getpid()
        lib = _lib()
        lib.prctl(_PR_SET_DUMPABLE, 0, 0, 0, 0)
        scope = _Scope(0, 0, _SCOPE_ALL)
        # A signal-and-socket scope that bash gets and this process does not (ABI >= 6).
        version = lib.syscall(_SYS_LANDLOCK_CREATE_RULESET, None, 0, 1)
        self.scope: _Scope | None = scope if version >= 6 else None

    # --- commands ------------------------------------------------------------------

    def _adopt_fork(self) -> None:
        """A copy made by fork_session: rewrite the source's workspace path to ours."""
        here = os.getcwd() if os.getpid() != self.pid else self.workspace
        if os.getpid() != self.pid:
            self.pid = os.getpid()
            if here != self.workspace:
                self.state = self.state.replace(self.workspace, here)
                self.workspace = here
            os.environ["HOME"] = os.environ["TMPDIR"] = os.environ["PWD"] = here

    def run(self, command: str, timeout: float, stdin: bytes | None) -> dict[str, Any]:
        self._adopt_fork()
        started = time.monotonic()
        state_in = os.memfd_create("state-in", os.MFD_CLOEXEC)
        state_out = os.memfd_create("state-out", os.MFD_CLOEXEC)
        out_r, out_w = os.pipe2(os.O_CLOEXEC)
        err_r, err_w = os.pipe2(os.O_CLOEXEC)
        in_r, in_w = os.pipe2(os.O_CLOEXEC) if stdin is not None else (-1, -1)
        try:
            os.write(state_in, self.state.encode())
            os.lseek(state_in, 0, os.SEEK_SET)
            before = _descendants(self.pid)
            pid = self._spawn(command, state_in, state_out, out_w, err_w, in_r)
        except BaseException:
            for fd in (state_in, state_out, out_r, out_w, err_r, err_w, in_r, in_w):
                if fd >= 0:
                    os.close(fd)
            raise
        for fd in (state_in, out_w, err_w, in_r):
            if fd >= 0:
                os.close(fd)
        try:
            status, outs, timed_out = self._collect(pid, out_r, err_r, in_w, stdin, timeout)
        finally:
            for fd in (out_r, err_r, in_w):
                if fd >= 0:
                    try:
                        os.close(fd)
                    except OSError:
                        pass
        if timed_out:
            _kill_new(self.pid, before, pid)
        saved = _read_all(state_out)
        os.close(state_out)
        text = saved.decode("utf-8", "surrogateescape")
        restarted = True
        if not timed_out and text.endswith(_STATE_END + "\n"):
            self.state = text
            restarted = False
        _reap()
        if os.WIFEXITED(status):
            code = os.WEXITSTATUS(status)
        elif os.WIFSIGNALED(status):
            code = -os.WTERMSIG(status)
        else:
            code = -1
        if timed_out:
            code = -1
        return {
            "returncode": code,
            "timed_out": timed_out,
            "restarted": restarted,
            "stdout": base64.b64encode(outs[0][0]).decode(),
            "stderr": base64.b64encode(outs[1][0]).decode(),
            "stdout_total": outs[0][1],
            "stderr_total": outs[1][1],
            "duration": time.monotonic() - started,
        }

    def _spawn(
        self, command: str, state_in: int, state_out: int, out_w: int, err_w: int, in_r: int
    ) -> int:
        argv = [BASH, "--noprofile", "--norc", "-c", _PRELUDE, "bash", command]
        env = dict(os.environ)
        env.pop("PWD", None)
        lib, scope = _lib(), self.scope
        devnull = os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC) if in_r < 0 else -1
        try:
            pid = os.fork()
            if pid == 0:  # pragma: no cover - the child execs or exits
                try:
                    os.setpgid(0, 0)
                    if scope is not None:
                        fd = lib.syscall(_SYS_LANDLOCK_CREATE_RULESET, ctypes.byref(scope), 24, 0)
                        if fd < 0 or lib.syscall(_SYS_LANDLOCK_RESTRICT_SELF, fd, 0) != 0:
                            os._exit(126)
                        os.close(fd)
                    os.dup2(in_r if in_r >= 0 else devnull, 0)
                    os.dup2(out_w, 1)
                    os.dup2(err_w, 2)
                    os.dup2(state_in, 3)
                    os.dup2(state_out, 4)
                    os.closerange(5, 65536)
                    signal.pthread_sigmask(signal.SIG_SETMASK, [])
                    for sig in (signal.SIGPIPE, signal.SIGINT, signal.SIGTERM, signal.SIGQUIT):
                        signal.signal(sig, signal.SIG_DFL)
                    os.chdir(self.workspace)
                    os.execve(BASH, argv, env)
                finally:
                    os._exit(127)
        finally:
            if devnull >= 0:
                os.close(devnull)
        return pid

    def _collect(
        self, pid: int, out_r: int, err_r: int, in_w: int, stdin: bytes | None, timeout: float
    ) -> tuple[int, list[tuple[bytes, int]], bool]:
        """Read both streams until bash exits (not until EOF: background jobs may hold them)."""
        cap = self.max_output
        bufs = [bytearray(), bytearray()]
        totals = [0, 0]
        fds = {out_r: 0, err_r: 1}
        for fd in fds:
            os.set_blocking(fd, False)
        pending = memoryview(stdin or b"")
        if in_w >= 0:
            os.set_blocking(in_w, False)
            if not pending:
                os.close(in_w)
                in_w = -1
        deadline = time.monotonic() + timeout
        status: int | None = None
        timed_out = False
        poller = select.poll()
        for fd in fds:
            poller.register(fd, select.POLLIN)
        if in_w >= 0:
            poller.register(in_w, select.POLLOUT)
        # pidfd: wake up when bash exits, not only when it writes.
        pidfd = os.pidfd_open(pid)
        poller.register(pidfd, select.POLLIN)
        try:
            while status is None:
                left = deadline - time.monotonic()
                if left <= 0:
                    timed_out = True
                    _killpg(pid)
                    _, status = os.waitpid(pid, 0)
                    break
                for fd, _events in poller.poll(min(left, 1.0) * 1000):
                    if fd == pidfd:
                        done, st = os.waitpid(pid, os.WNOHANG)
                        if done:
                            status = st
                    elif fd == in_w:
                        try:
                            n = os.write(in_w, pending[:65536])
                            pending = pending[n:]
                        except BlockingIOError:
                            n = 0
                        except OSError:  # the command closed its stdin
                            pending = pending[:0]
                        if not pending:
                            poller.unregister(in_w)
                            os.close(in_w)
                            in_w = -1
                    elif fd in fds and not _drain(fd, bufs[fds[fd]], totals, fds[fd], cap):
                        poller.unregister(fd)
            for fd, index in fds.items():  # what the command wrote before it exited
                _drain(fd, bufs[index], totals, index, cap)
        finally:
            os.close(pidfd)
            if in_w >= 0:
                os.close(in_w)
        return status, [(bytes(bufs[0]), totals[0]), (bytes(bufs[1]), totals[1])], timed_out

    # --- files ---------------------------------------------------------------------

    def _path(self, path: str) -> str:
        self._adopt_fork()
        return os.path.join(self.workspace, path)

    def write_file(self, path: str, data_b64: str, mode: int) -> dict[str, Any]:
        data = base64.b64decode(data_b64)
        full = self._path(path)
        try:
            parent = os.path.dirname(full)
            if parent:
                os.makedirs(parent, exist_ok=True)
            fd = os.open(full, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, mode)
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view) :]
            finally:
                os.close(fd)
        except OSError as exc:
            return _error(exc)
        return {"ok": True, "size": len(data)}

    def read_file(self, path: str) -> dict[str, Any]:
        full = self._path(path)
        try:
            fd = os.open(full, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
            try:
                info = os.fstat(fd)
                if stat.S_ISDIR(info.st_mode):
                    return {"ok": False, "errno": "EISDIR", "message": "Is a directory"}
                if not stat.S_ISREG(info.st_mode):
                    return {"ok": False, "errno": "ENOTREG", "message": "Not a regular file"}
                if info.st_size > self.max_file:
                    return {
                        "ok": False,
                        "errno": "EFBIG",
                        "message": "File too large",
                        "size": info.st_size,
                    }
                chunks: list[bytes] = []
                total = 0
                while True:
                    chunk = os.read(fd, 1 << 20)
                    if not chunk:
                        break
                    total += len(chunk)
                    if total > self.max_file:
                        return {
                            "ok": False,
                            "errno": "EFBIG",
                            "message": "File too large",
                            "size": total,
                        }
                    chunks.append(chunk)
            finally:
                os.close(fd)
        except OSError as exc:
            return _error(exc)
        return {"ok": True, "data": base64.b64encode(b"".join(chunks)).decode()}

    def list_files(self, path: str, limit: int) -> dict[str, Any]:
        full = self._path(path)
        entries: list[list[Any]] = []
        try:
            with os.scandir(full) as it:
                for entry in it:
                    if len(entries) >= limit:
                        break
                    try:
                        info = entry.stat(follow_symlinks=False)
                    except OSError:
                        continue
                    kind = (
                        "dir"
                        if stat.S_ISDIR(info.st_mode)
                        else "symlink"
                        if stat.S_ISLNK(info.st_mode)
                        else "file"
                        if stat.S_ISREG(info.st_mode)
                        else "other"
                    )
                    entries.append([entry.name, kind, info.st_size])
        except OSError as exc:
            return _error(exc)
        entries.sort()
        return {"ok": True, "entries": entries}


def _error(exc: OSError) -> dict[str, Any]:
    code = errno.errorcode.get(exc.errno or 0, "EIO")
    return {"ok": False, "errno": code, "message": exc.strerror or str(exc)}


def _drain(fd: int, buf: bytearray, totals: list[int], index: int, cap: int) -> bool:
    """Read what is there now; False at EOF."""
    while True:
        try:
            chunk = os.read(fd, 65536)
        except BlockingIOError:
            return True
        except OSError:
            return False
        if not chunk:
            return False
        totals[index] += len(chunk)
        room = cap + 1 - len(buf)
        if room > 0:
            buf += chunk[:room]


def _read_all(fd: int) -> bytes:
    os.lseek(fd, 0, os.SEEK_SET)
    chunks: list[bytes] = []
    while True:
        chunk = os.read(fd, 1 << 20)
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)


def _killpg(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except OSError:
        pass


def _children() -> dict[int, int]:
    """pid -> parent pid of every process this /proc shows."""
    parents = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as fh:
                fields = fh.read().rsplit(b")", 1)[1].split()
            parents[int(name)] = int(fields[1])
        except (OSError, ValueError, IndexError):
            continue
    return parents


def _descendants(root: int) -> set[int]:
    parents = _children()
    found: set[int] = set()
    frontier = {root}
    while frontier:
        frontier = {pid for pid, ppid in parents.items() if ppid in frontier} - found
        found |= frontier
    return found


def _kill_new(root: int, before: set[int], pgid: int) -> None:
    """Kill the command's tree: its group and every descendant born since it started."""
    for _ in range(8):
        _killpg(pgid)
        new = _descendants(root) - before
        alive = False
        for pid in new:
            try:
                with open(f"/proc/{pid}/stat", "rb") as fh:
                    if fh.read().rsplit(b")", 1)[1].split()[0] == b"Z":
                        continue
                os.kill(pid, signal.SIGKILL)
                alive = True
            except OSError:
                continue
        _reap()
        if not alive:
            return


def _reap() -> None:
    """Collect orphans this subreaper inherited (background jobs that ended)."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


_shell: Shell | None = None


def call(op: str, args: dict[str, Any], config: dict[str, Any]) -> None:
    """Entry point of every request: one JSON line on stdout."""
    global _shell
    if _shell is None:
        _shell = Shell(os.getcwd(), max_output=config["max_output"], max_file=config["max_file"])
    shell = _shell
    if op == "run":
        stdin = None if args["stdin"] is None else base64.b64decode(args["stdin"])
        reply = shell.run(args["command"], args["timeout"], stdin)
    elif op == "write":
        reply = shell.write_file(args["path"], args["data"], args.get("mode", 0o644))
    elif op == "read":
        reply = shell.read_file(args["path"])
    elif op == "list":
        reply = shell.list_files(args["path"], args["limit"])
    elif op == "workspace":
        shell._adopt_fork()
        reply = {"ok": True, "workspace": shell.workspace}
    else:
        reply = {"ok": False, "errno": "EINVAL", "message": f"unknown operation {op!r}"}
    print(json.dumps(reply))
