"""The shell supervisor: runs inside a sandboxed Python session, standard library only.

The host never imports this module: it sends its source once to each session
(``ShellService`` execs it there), so it runs with exactly the session's
rights (uid, rlimits, namespaces, Landlock, seccomp). It holds the shell state
of one session (a bash script that restores variables, functions, aliases,
options and the working directory) and, for each command, runs a fresh
``bash`` as its child: started when the previous command ended, it restores
that state (from a private memfd) before the command arrives, then runs the
command, and on exit writes the new state into another private memfd. So:

* the exit status is bash's own exit status, seen by ``waitpid``: nothing the
  command prints, closes or redirects can end it early or fake it;
* ``exit``, ``exec``, ``kill -9 $$`` end only that bash; the next command gets
  a fresh one, restored from the last state saved (``restarted`` says when
  this command's changes could not be saved);
* each bash runs in its own process group, started by the session's spawner
  (``_spawner``) in a nested Landlock domain scoped for signals: commands can
  signal each other's processes, never this supervisor;
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
import sys
import time
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from toolservices.shell import _pyworker, _terminal
    from toolservices.shell._spawner import Spawner
elif "_toolservices_shell_spawner" in sys.modules:  # in a session: loaded just before this one
    Spawner = sys.modules["_toolservices_shell_spawner"].Spawner
    _terminal = sys.modules["_toolservices_shell_terminal"]
    _pyworker = sys.modules["_toolservices_shell_python"]
else:  # on the host (tests)
    from toolservices.shell import _pyworker, _terminal
    from toolservices.shell._spawner import Spawner

BASH = "/bin/bash"
_STATE_END = "#toolservices-state-end"
_MAX_LINGERING = 64
_PR_SET_DUMPABLE = 4

# The script every bash runs, started ahead of need as a spare: wait for a line on the
# pipe on fd 3 (the state is ready), restore the state from the memfd on fd 5, then
# wait for the command (the rest of the pipe, read to its end) and run it with an EXIT
# trap that saves the new state into the memfd on fd 4. The state is restored before
# the command arrives: the supervisor fills fd 5 as soon as the previous command ended.
_PRELUDE = r"""
__ts_opts() {
  [[ $1 == "$SHELLOPTS" && $2 == "$BASHOPTS" ]] && return  # the usual case: nothing to set
  builtin local __ts_o
  builtin local -a __ts_l
  IFS=: builtin read -r -a __ts_l <<<"$SHELLOPTS"
  for __ts_o in "${__ts_l[@]}"; do
    [[ :$1: == *":$__ts_o:"* ]] || builtin set +o "$__ts_o" 2>/dev/null
  done
  IFS=: builtin read -r -a __ts_l <<<"$1"
  for __ts_o in "${__ts_l[@]}"; do builtin set -o "$__ts_o" 2>/dev/null; done
  IFS=: builtin read -r -a __ts_l <<<"$BASHOPTS"
  for __ts_o in "${__ts_l[@]}"; do
    [[ :$2: == *":$__ts_o:"* ]] || builtin shopt -u "$__ts_o" 2>/dev/null
  done
  IFS=: builtin read -r -a __ts_l <<<"$2"
  for __ts_o in "${__ts_l[@]}"; do builtin shopt -s "$__ts_o" 2>/dev/null; done
}
__ts_save() {
  builtin local __ts_so=$SHELLOPTS __ts_bo=$BASHOPTS
  builtin set +o errexit +o nounset +o xtrace +o verbose +o noclobber +o noglob +o posix 2>/dev/null
  {
    builtin declare -p
    builtin declare -f
    builtin alias -p
    builtin printf '#ts-limits -S\n'
    builtin ulimit -S -a
    builtin printf '#ts-limits -H\n'
    builtin ulimit -H -a
    builtin printf '#ts-limits end\n'
    builtin printf 'builtin cd -- %q 2>/dev/null\n' "$PWD"
    builtin printf '__ts_opts %q %q\n' "$__ts_so" "$__ts_bo"
    builtin printf '%s\n' '#toolservices-state-end'
  } >/dev/fd/4 2>/dev/null
}
builtin shopt -s expand_aliases  # as in an interactive terminal (the state may turn it off)
builtin read -r __ts_cmd <&3 || builtin exit 1
builtin trap __ts_save EXIT
builtin source /dev/fd/5 2>/dev/null
builtin source /dev/fd/3 2>/dev/null
RANDOM=$SRANDOM
exec 3<&- 5<&-  # "builtin exec" would close them for that one command only
builtin eval "$__ts_cmd"
"""

_libc: Any = None


def _lib() -> Any:
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(None, use_errno=True)
    return _libc


def _quote(text: str) -> bytes:
    """``text`` as one bash ``$'...'`` word (every byte outside printable ASCII escaped)."""
    out = bytearray(b"$'")
    for byte in text.encode("utf-8", "surrogateescape"):
        if byte < 0x20 or byte >= 0x7F or byte in (0x27, 0x5C):
            out += b"\\x%02x" % byte
        else:
            out.append(byte)
    out += b"'"
    return bytes(out)


def _start_state(directory: str) -> str:
    """A shell state that only changes directory: to ``directory``, made if missing."""
    word = _quote(directory).decode()
    return (
        f"builtin cd -- {word} 2>/dev/null || "
        f"{{ mkdir -p -- {word} && builtin cd -- {word}; }} 2>/dev/null\n{_STATE_END}\n"
    )


class _Spare:
    """A bash started ahead of need, blocked reading its state, then its command."""

    def __init__(
        self, cmd_w: int, out_r: int, err_r: int, in_w: int, state_out: int, state_in: int
    ) -> None:
        self.cmd_w, self.out_r, self.err_r, self.in_w = cmd_w, out_r, err_r, in_w
        self.state_out, self.state_in = state_out, state_in
        self.pid = 0
        #: the generation of the shell state it was given (-1: none yet, -2: it is dead)
        self.generation = -1

    def prime(self, state: bytes, generation: int) -> None:
        """Hand it the state to restore now, before its command is known."""
        try:
            view = memoryview(state)
            while view:  # a memfd: never blocks
                view = view[os.write(self.state_in, view) :]
            os.close(self.state_in)
            self.state_in = -1
            os.write(self.cmd_w, b"\n")  # one byte in a fresh pipe: never blocks
        except OSError:  # its bash is gone (a command killed it): never to be used
            self.generation = -2
            return
        self.generation = generation

    def close(self) -> None:
        for fd in (self.cmd_w, self.out_r, self.err_r, self.in_w, self.state_out, self.state_in):
            if fd >= 0:
                try:
                    os.close(fd)
                except OSError:
                    pass
        self.cmd_w = self.out_r = self.err_r = self.in_w = self.state_out = self.state_in = -1


class Shell:
    """One session's shell: its saved state, its workspace, its spawner and spare bash."""

    def __init__(
        self,
        workspace: str,
        *,
        max_output: int,
        max_file: int,
        command_stack: int | None = None,
        offline: bool = True,
        start_dir: str | None = None,
    ) -> None:
        _terminal.command_limits(command_stack)  # inherited by the spawner, so by every bash
        self.workspace = workspace
        self.home = _terminal.make_home(workspace)
        self.offline = offline
        self.max_output = max_output
        self.max_file = max_file
        # the first command's bash starts in the workspace, or in ``start_dir`` (an
        # image's WorkingDir, made if the image lacks it, as docker does); later ones
        # where the previous command left off (the saved state's ``cd``)
        self.state = "" if not start_dir else _start_state(start_dir)
        # bumped at each change of ``state``: a spare primed with another generation is stale
        self.generation = 0
        self.pid = os.getpid()
        _lib().prctl(_PR_SET_DUMPABLE, 0, 0, 0, 0)
        self.spawner: Spawner | None = None
        self.pending: _Spare | None = None
        # stdout/stderr pipes of finished commands that background jobs still hold: kept
        # open and drained, so that a job printing later is not killed by SIGPIPE
        self.lingering: list[int] = []

    # --- commands ------------------------------------------------------------------

    def home_archive(self) -> dict[str, Any]:
        """HOME as a base64 tar, for ``fork_session`` (empty when HOME is the workspace)."""
        if self.home == self.workspace or not os.path.isdir(self.home):
            return {"ok": True, "home": ""}
        reply = get_archive(self.home, self.max_file, arcname=".")
        if reply.get("errno") == "EFBIG":
            reply["message"] = (
                f"HOME ({self.home}) holds more than {self.max_file} bytes: "
                "too much to copy; remove caches there"
            )
        return {"ok": True, "home": reply["data"]} if reply["ok"] else reply

    def adopt(self, state: str, source: str, home: str = "") -> dict[str, Any]:
        """Take a shell state saved by another session (``fork_session``: a fresh copy).

        It is the text the source's own bash wrote; this session's bash runs it
        with this session's rights, as it would run any command. ``source`` is
        the source's workspace: the same path as ours with session namespaces;
        without them the state's references to it are rewritten to ours.
        """
        if not state.endswith(_STATE_END + "\n"):
            return {"ok": False, "errno": "EINVAL", "message": "not a saved shell state"}
        if source != self.workspace:
            state = state.replace(source, self.workspace)
        if home:
            copied = put_archive(self.home, home)
            if not copied["ok"]:
                return {**copied, "message": f"cannot copy HOME: {copied['message']}"}
        self.state = state
        self.generation += 1  # a spare primed with the state this session started with is stale
        return {"ok": True}

    def _drain_lingering(self, keep: tuple[int, ...] = ()) -> None:
        """Discard what background jobs printed since; close the pipes nobody writes anymore."""
        alive = []
        for fd in [*self.lingering, *keep]:
            while True:
                try:
                    if os.read(fd, 65536):
                        continue
                except BlockingIOError:
                    alive.append(fd)
                    break
                except OSError:
                    pass
                os.close(fd)  # end of file: every writer is gone
                break
        while len(alive) > _MAX_LINGERING:  # a bound on descriptors; the oldest go
            os.close(alive.pop(0))
        self.lingering = alive

    def _request_spare(self) -> None:
        """Ask the spawner for the next command's bash; it starts while we reply."""
        if self.spawner is None:
            env = _terminal.command_env(dict(os.environ), self.home, self.offline)
            argv = [BASH, "--noprofile", "--norc", "-c", _PRELUDE, "bash"]
            self.spawner = Spawner(argv, env, self.workspace)
        cmd_r, cmd_w = os.pipe2(os.O_CLOEXEC)
        out_r, out_w = os.pipe2(os.O_CLOEXEC)
        err_r, err_w = os.pipe2(os.O_CLOEXEC)
        in_r, in_w = os.pipe2(os.O_CLOEXEC)
        state_out = os.memfd_create("state-out", os.MFD_CLOEXEC)
        state_in = os.memfd_create("state-in", os.MFD_CLOEXEC)
        spare = _Spare(cmd_w, out_r, err_r, in_w, state_out, state_in)
        try:
            self.spawner.request([in_r, out_w, err_w, cmd_r, state_out, state_in])
        except OSError:
            spare.close()
            self._drop_spawner()
            raise
        finally:
            for fd in (cmd_r, out_w, err_w, in_r):
                os.close(fd)
        self.pending = spare

    def _drop_spawner(self) -> None:
        if self.spawner is not None:
            self.spawner.kill()
            self.spawner = None
        _reap()

    def _take_spare(self) -> _Spare:
        for _attempt in range(3):
            try:
                if self.pending is None:
                    self._request_spare()
                spare = self.pending
                assert spare is not None and self.spawner is not None
                spare.pid = self.spawner.reply()
            except OSError:  # the spawner died (a command may kill it): start another
                if self.pending is not None:
                    self.pending.close()
                    self.pending = None
                self._drop_spawner()
                continue
            self.pending = None
            if _state(spare.pid) in (b"Z", b"X"):
                # killed with the tree of the previous command (timeout, waiting for keys),
                # which it looked part of: reap it and use another
                _reap()
                spare.close()
                continue
            if _parent(spare.pid) != os.getpid():
                # started while we were not a subreaper (fork_session clears it for a moment):
                # someone else reaps it, so we could not learn its status. Use another.
                _killpg(spare.pid)
                spare.close()
                continue
            if spare.generation == -1:
                self._prime(spare)
            if spare.generation != self.generation:  # dead, or restored another state
                _killpg(spare.pid)
                spare.close()
                continue
            return spare
        raise OSError(errno.EAGAIN, "could not start bash (process budget used up?)")

    def prepare_next(self) -> None:
        """Start the next command's bash and have it restore the state while we reply."""
        if self.pending is None:
            try:
                self._request_spare()
            except OSError:
                return  # asked again (and reported) by the next command
        assert self.pending is not None
        if self.pending.generation == -1:
            self._prime(self.pending)

    def _prime(self, spare: _Spare) -> None:
        spare.prime(self.state.encode("utf-8", "surrogateescape"), self.generation)

    def _discard_pending(self) -> None:
        """Drop the spare asked for while the command ran (it was born after the command,
        so the timeout's tree kill may have hit it: a later command must not get a dead bash)."""
        stale, self.pending = self.pending, None
        if stale is None:
            return
        try:
            if self.spawner is not None:
                stale.pid = self.spawner.reply()
                _killpg(stale.pid)
        except OSError:
            self._drop_spawner()
        stale.close()

    def run(self, command: str, timeout: float, stdin: bytes | None) -> dict[str, Any]:
        started = time.monotonic()
        self._drain_lingering()
        spare = self._take_spare()
        pid = spare.pid
        born = _start_time(pid)
        # Background jobs of earlier commands, reparented to us: never this command's,
        # even when they forked after this command's bash was started as a spare.
        earlier = _children(self.pid)
        try:
            script = b"__ts_cmd=" + _quote(command) + b"\n"
            # Both written from the poll loop: a stopped bash (kill -STOP) cannot block us.
            writes = {spare.cmd_w: script, spare.in_w: stdin or b""}
            spare.cmd_w = spare.in_w = -1
            status, outs, timed_out, stuck = self._collect(
                pid, spare.out_r, spare.err_r, writes, timeout
            )
            if timed_out or stuck:
                spawner = 0 if self.spawner is None else self.spawner.pid
                _kill_tree(self.pid, pid, born, spawner, earlier)
                self._discard_pending()
            saved = _read_all(spare.state_out)
            kept = (spare.out_r, spare.err_r)
            spare.out_r = spare.err_r = -1
            self._drain_lingering(kept)
        finally:
            spare.close()
        text = _terminal.compact_limits(saved.decode("utf-8", "surrogateescape"))
        restarted = True
        if not timed_out and not stuck and text.endswith(_STATE_END + "\n"):
            if text != self.state:
                self.state = text
                self.generation += 1
            restarted = False
        self.prepare_next()
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
            "no_terminal": stuck,
            "returncode": code,
            "timed_out": timed_out,
            "restarted": restarted,
            "stdout": base64.b64encode(outs[0][0]).decode(),
            "stderr": base64.b64encode(outs[1][0]).decode(),
            "stdout_total": outs[0][1],
            "stderr_total": outs[1][1],
            "duration": time.monotonic() - started,
            "limit": timeout,
        }

    def _collect(
        self, pid: int, out_r: int, err_r: int, writes: dict[int, bytes], timeout: float
    ) -> tuple[int, list[tuple[bytes, int]], bool, str]:
        """Feed ``writes`` (fd: data, closed once written) and read both streams until bash exits.

        Not until EOF: background jobs may hold the streams open. The last item
        names a program of the command found waiting for terminal input (then
        the command was killed), or is empty.
        """
        cap = self.max_output
        bufs = [[bytearray(), bytearray()], [bytearray(), bytearray()]]
        totals = [0, 0]
        fds = {out_r: 0, err_r: 1}
        pending: dict[int, memoryview] = {}
        poller = select.poll()
        for fd in fds:
            os.set_blocking(fd, False)
            poller.register(fd, select.POLLIN)
        for fd, data in writes.items():
            if data:
                os.set_blocking(fd, False)
                pending[fd] = memoryview(data)
                poller.register(fd, select.POLLOUT)
            else:
                os.close(fd)  # end of file at once: stdin without input
        deadline = time.monotonic() + timeout
        status: int | None = None
        timed_out = False
        stuck = ""
        pipes = {os.fstat(fd).st_ino for fd in fds}
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
                events = poller.poll(min(left, 1.0) * 1000)
                if not events and not pending:  # a quiet second: waiting for keys?
                    stuck = _waits_for_terminal(pid, pipes)
                    if stuck:
                        _killpg(pid)
                        _, status = os.waitpid(pid, 0)
                        break
                for fd, _events in events:
                    if fd == pidfd:
                        done, st = os.waitpid(pid, os.WNOHANG)
                        if done:
                            status = st
                    elif fd in pending:
                        view = pending[fd]
                        try:
                            view = view[os.write(fd, view[:65536]) :]
                        except BlockingIOError:
                            pass
                        except OSError:  # the reader is gone (closed its stdin, exited)
                            view = view[:0]
                        pending[fd] = view
                        if not view:
                            poller.unregister(fd)
                            os.close(fd)
                            del pending[fd]
                    elif fd in fds and not _drain(fd, bufs[fds[fd]], totals, fds[fd], cap):
                        poller.unregister(fd)
            for fd, index in fds.items():  # what the command wrote before it exited
                _drain(fd, bufs[index], totals, index, cap)
        finally:
            os.close(pidfd)
            for fd in pending:
                os.close(fd)
        outs = [(_kept(bufs[0], cap), totals[0]), (_kept(bufs[1], cap), totals[1])]
        return status, outs, timed_out, stuck

    # --- files ---------------------------------------------------------------------

    def _path(self, path: str) -> str:
        return os.path.join(self.workspace, path)

    def write_file(self, path: str, data_b64: str, mode: int) -> dict[str, Any]:
        data = base64.b64decode(data_b64)
        full = self._path(path)
        try:
            _makedirs(os.path.dirname(full))
            fd = _open_regular(full, os.O_WRONLY | os.O_TRUNC, create=mode)
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
            fd = _open_regular(full, os.O_RDONLY)
            try:
                info = os.fstat(fd)
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


def put_archive(dest: str, data_b64: str) -> dict[str, Any]:
    """Unpack a tar into ``dest`` with the session's rights; nothing at all if any entry
    would land outside ``dest`` (``..``, absolute names, links out, through a link)."""
    import io
    import tarfile

    check = getattr(tarfile, "data_filter", None)
    if check is None:
        return {
            "ok": False,
            "errno": "ENOSYS",
            "message": "needs Python >= 3.10.12 / 3.11.4 (tarfile extraction filters)",
        }
    try:
        with tarfile.open(fileobj=io.BytesIO(base64.b64decode(data_b64)), mode="r:*") as tar:
            members = tar.getmembers()
            real = os.path.realpath(dest)
            for member in members:  # all checked before anything is written
                check(member, real)
            os.makedirs(real, exist_ok=True)
            for member in members:  # replaced, never written through (as GNU tar does): a
                # planted FIFO would block, a planted link reach a descriptor of this process
                target = os.path.join(real, member.name)
                if not member.isdir() and os.path.lexists(target) and not os.path.isdir(target):
                    os.unlink(target)
            tar.extractall(real, filter="data")
    except tarfile.FilterError as exc:
        return {"ok": False, "errno": "EPERM", "message": f"refused, nothing written: {exc}"}
    except (tarfile.TarError, EOFError) as exc:
        return {"ok": False, "errno": "EINVAL", "message": f"not a readable tar archive: {exc}"}
    except OSError as exc:
        return _error(exc)
    return {"ok": True, "entries": len(members)}


class _Capped:
    """A write-only buffer that refuses to grow past ``cap`` bytes."""

    def __init__(self, cap: int) -> None:
        self.data = bytearray()
        self.cap = cap

    def write(self, chunk: bytes) -> int:
        if len(self.data) + len(chunk) > self.cap:
            raise OverflowError
        self.data += chunk
        return len(chunk)

    def tell(self) -> int:
        return len(self.data)


def get_archive(path: str, cap: int, arcname: str | None = None) -> dict[str, Any]:
    """A tar of ``path`` (a file or a tree; links kept as links), at most ``cap`` bytes;
    its top entry is named ``arcname`` (by default ``path``'s name)."""
    import tarfile

    out = _Capped(cap)
    try:
        os.lstat(path)
        with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:  # type: ignore[call-overload]
            name = arcname or os.path.basename(path.rstrip("/")) or "."
            tar.add(path, arcname=name, recursive=True)
    except OverflowError:
        return {"ok": False, "errno": "EFBIG", "message": f"the archive exceeds {cap} bytes"}
    except OSError as exc:
        return _error(exc)
    return {"ok": True, "data": base64.b64encode(bytes(out.data)).decode()}


class _NotRegular(OSError):
    """The path names something other than a regular file (a FIFO, a device, a socket)."""


def _error(exc: OSError) -> dict[str, Any]:
    if isinstance(exc, _NotRegular):
        return {"ok": False, "errno": "ENOTREG", "message": "Not a regular file"}
    if exc.errno == errno.EAGAIN:  # O_NONBLOCK met a lease (or a mandatory lock)
        message = "Resource temporarily unavailable: a process of the session holds a lease on it"
        return {"ok": False, "errno": "EAGAIN", "message": message}
    code = errno.errorcode.get(exc.errno or 0, "EIO")
    return {"ok": False, "errno": code, "message": exc.strerror or str(exc)}


_proc_dev: int | None = None


def _ours_in_proc(device: int, pinned: int, *, write: bool) -> bool:
    """Whether a pinned file is one the file tools leave alone in ``/proc``: any of it to
    write (``/proc/self/mem``, ``comm``, ``oom_score_adj``...), this supervisor's own
    entries to read (its memory, environment, descriptors); the rest reads like ``cat``."""
    global _proc_dev
    if _proc_dev is None:
        _proc_dev = os.stat("/proc").st_dev
    if device != _proc_dev:
        return False
    if write:
        return True
    parts = os.readlink(f"/proc/self/fd/{pinned}").split("/")
    return len(parts) > 2 and parts[2] in (str(os.getpid()), "self", "thread-self")


def _makedirs(path: str) -> None:
    """``os.makedirs(path, exist_ok=True)`` without recursion (a path may have 2,000 levels)."""
    missing = []
    while path and not os.path.isdir(path):
        missing.append(path)
        parent = os.path.dirname(path)
        if parent == path:
            break
        path = parent
    for directory in reversed(missing):
        try:
            os.mkdir(directory)
        except FileExistsError:
            if not os.path.isdir(directory):
                raise


def _own_files(skip: int) -> set[tuple[int, int]]:
    """(device, inode) of every descriptor this supervisor holds, but ``skip``."""
    own = set()
    for name in os.listdir("/proc/self/fd"):
        if int(name) == skip:
            continue
        try:
            info = os.fstat(int(name))
        except OSError:  # the listing's own descriptor, closed by now
            continue
        own.add((info.st_dev, info.st_ino))
    return own


def _open_regular(full: str, flags: int, *, create: int | None = None) -> int:
    """Open the regular file ``full`` as the session's commands would reach it, without blocking.

    Symlinks are followed (``cat`` and ``>`` follow them too), but what is opened
    is pinned first with ``O_PATH``, which neither blocks, truncates nor
    reaches a device: a FIFO, a device or a socket is refused (``ENOTREG``),
    and so is a file this supervisor holds open itself (its reply channel
    ``/dev/stdout``, ``/dev/fd/N``, ``/proc/self/fd/N``, a state memfd, or a
    symlink to any of them): only then is it reopened, with ``O_NONBLOCK``
    (a lease answers ``EAGAIN``, never a wait). ``create`` (a mode) makes a
    missing file, as a new regular file only (``O_EXCL``).
    """
    for _attempt in range(8):
        try:
            pinned = os.open(full, os.O_PATH | os.O_CLOEXEC)
        except FileNotFoundError:
            if create is None:
                raise
            try:  # a new file, never an existing one nor a symlink's target reached by a race
                return os.open(
                    full, flags | os.O_CREAT | os.O_EXCL | os.O_NONBLOCK | os.O_CLOEXEC, create
                )
            except FileExistsError:
                if os.path.islink(full) and not os.path.exists(full):
                    # a dangling symlink: `>` would create its target; do the same, pinned
                    full = os.path.join(os.path.dirname(full), os.readlink(full))
                continue  # made meanwhile: pin it
        try:
            info = os.fstat(pinned)
            if stat.S_ISDIR(info.st_mode):
                raise IsADirectoryError(errno.EISDIR, "Is a directory")
            if not stat.S_ISREG(info.st_mode):
                raise _NotRegular(errno.EINVAL, "Not a regular file")
            if (info.st_dev, info.st_ino) in _own_files(pinned) or _ours_in_proc(
                info.st_dev, pinned, write=flags & os.O_ACCMODE != os.O_RDONLY
            ):
                raise PermissionError(errno.EACCES, "Permission denied")
            return os.open(f"/proc/self/fd/{pinned}", flags | os.O_NONBLOCK | os.O_CLOEXEC)
        finally:
            os.close(pinned)
    raise FileExistsError(errno.EEXIST, "File exists (it kept changing while being opened)")


def _drain(fd: int, buf: list[bytearray], totals: list[int], index: int, cap: int) -> bool:
    """Read what is there now, keeping its head and tail (see :func:`_kept`); False at EOF."""
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
        head, tail = buf
        room = cap - cap // 2 - len(head)
        if room > 0:
            head += chunk[:room]
            chunk = chunk[room:]
        keep = cap // 2
        if chunk and keep:
            tail += chunk[-keep:]
            if len(tail) > 2 * keep:  # trimmed now and then: linear in what is read
                del tail[:-keep]


def _kept(buf: list[bytearray], cap: int) -> bytes:
    """At most ``cap`` bytes of a stream: its first ``cap - cap // 2`` and its last
    ``cap // 2`` (all of it when it was no longer); the host marks the cut between."""
    head, tail = buf
    keep = cap // 2
    return bytes(head) + (bytes(tail[-keep:]) if keep else b"")


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


def _stat(pid: int | str) -> list[bytes]:
    """The fields of /proc/<pid>/stat after the command name (state is [0], ppid [1])."""
    with open(f"/proc/{pid}/stat", "rb") as fh:
        return fh.read().rsplit(b")", 1)[1].split()


def _state(pid: int) -> bytes:
    try:
        return _stat(pid)[0]
    except (OSError, IndexError):
        return b"X"


def _parent(pid: int) -> int:
    try:
        return int(_stat(pid)[1])
    except (OSError, ValueError, IndexError):
        return 0


def _waits_for_terminal(group: int, pipes: set[int]) -> str:
    """The name of a sleeping process of ``group`` whose stdin is a write-only output pipe, or "".

    With no terminal, vim (``vi``, ``view``, ``ex``) takes its stderr as its input
    once stdin ends, and waits for it to become readable: a write-only pipe
    never does. Nothing can ever arrive there, so the wait would last until
    the time limit.
    """
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            fields = _stat(name)
            if int(fields[2]) != group or fields[0] != b"S":
                continue
            if os.stat(f"/proc/{name}/fd/0").st_ino not in pipes:
                continue
            with open(f"/proc/{name}/wchan", "rb") as fh:
                wchan = fh.read()
            if b"select" not in wchan and b"poll" not in wchan:
                continue  # asleep for another reason (sleep, a child, a lock)
            with open(f"/proc/{name}/fdinfo/0", "rb") as fh:
                info = fh.read()
            flags = int(info.split(b"flags:", 1)[1].split()[0], 8)
            if flags & os.O_ACCMODE != os.O_WRONLY:
                continue
            with open(f"/proc/{name}/comm", "rb") as fh:
                return fh.read().strip().decode("utf-8", "replace") or "?"
        except (OSError, ValueError, IndexError):
            continue
    return ""


def _start_time(pid: int) -> int:
    try:
        return int(_stat(pid)[19])  # field 22: start time in clock ticks since boot
    except (OSError, ValueError, IndexError):
        return 0


def _children(root: int) -> dict[int, tuple[int, int]]:
    """``root``'s children now, pid -> (start time, to tell a reused pid apart; group)."""
    pids: list[int] = []
    try:
        for task in os.listdir(f"/proc/{root}/task"):
            with open(f"/proc/{root}/task/{task}/children", "rb") as fh:
                pids.extend(int(p) for p in fh.read().split())
    except FileNotFoundError:  # a kernel without CONFIG_PROC_CHILDREN: scan
        pids = [
            int(name)
            for name in os.listdir("/proc")
            if name.isdigit() and _parent(int(name)) == root
        ]
    found = {}
    for pid in pids:
        try:
            fields = _stat(pid)
            found[pid] = (int(fields[19]), int(fields[2]))
        except (OSError, ValueError, IndexError):
            continue  # gone already
    return found


def _kill_tree(
    root: int, bash: int, born: int, spared: int, earlier: dict[int, tuple[int, int]]
) -> None:
    """Kill the timed-out command's tree, and nothing of the commands before it.

    Orphans come back to ``root`` (a subreaper). Among its children, the
    command's are those in its process group (``bash``'s pid) or started after
    its bash (a higher pid and a start time not before ``born``: ``setsid``,
    double forks) and not among ``earlier`` (root's children when the command
    started: the spare bash is started when the previous command ends, so a job
    that command put in the background can fork after it); everything below
    them goes too. Background jobs of earlier commands are in older groups, and
    so are the processes they start later (an orphan of their double fork is
    spared by its group); ``spared`` (the spawner) stays.
    """
    older = {group for _start, group in earlier.values() if group != bash}
    for _ in range(16):
        info: dict[int, tuple[int, int, int, bytes]] = {}  # pid -> ppid, pgid, start, state
        for name in os.listdir("/proc"):
            if name.isdigit():
                try:
                    fields = _stat(name)
                    info[int(name)] = (int(fields[1]), int(fields[2]), int(fields[19]), fields[0])
                except (OSError, ValueError, IndexError):
                    continue
        frontier = {
            pid
            for pid, (ppid, pgid, start, _state) in info.items()
            if ppid == root
            and pid != spared
            and (
                pgid == bash
                or (
                    pid >= bash
                    and start >= born
                    and earlier.get(pid, (-1, -1))[0] != start
                    and pgid not in older
                )
            )
        }
        tree: set[int] = set()
        while frontier:
            tree |= frontier
            frontier = {p for p, row in info.items() if row[0] in frontier} - tree
        victims = [p for p in tree if info[p][3] != b"Z"]
        for pid in victims:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                continue
        _reap()
        if not victims:
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
        _shell = Shell(
            os.getcwd(),
            max_output=config["max_output"],
            max_file=config["max_file"],
            command_stack=config.get("command_stack"),
            offline=config.get("offline", True),
            start_dir=config.get("start_dir"),
        )
    shell = _shell
    if op == "run":
        stdin = None if args["stdin"] is None else base64.b64decode(args["stdin"])
        try:
            reply = shell.run(args["command"], args["timeout"], stdin)
        except OSError as exc:  # no bash could start: the process budget, most likely
            message = f"bash: cannot start the command: {exc.strerror or exc}\n".encode()
            reply = {
                "returncode": 126,
                "timed_out": False,
                "restarted": False,
                "stdout": "",
                "stderr": base64.b64encode(message).decode(),
                "stdout_total": 0,
                "stderr_total": len(message),
                "duration": 0.0,
                "limit": args["timeout"],
            }
    elif op == "write":
        reply = shell.write_file(args["path"], args["data"], args.get("mode", 0o644))
    elif op == "read":
        reply = shell.read_file(args["path"])
    elif op == "list":
        reply = shell.list_files(args["path"], args["limit"])
    elif op == "put_archive":
        reply = put_archive(shell._path(args["path"]), args["data"])
    elif op == "get_archive":
        reply = get_archive(shell._path(args["path"]), shell.max_file)
    elif op == "warm":  # a spare interpreter, ahead of need: the first bash starts now
        shell.prepare_next()
        reply = {"ok": True}
    elif op == "workspace":
        reply = {"ok": True, "workspace": shell.workspace}
    elif op == "state":  # in parts: it may be larger than one reply may be
        start = int(args.get("offset", 0))
        part = shell.state[start : start + int(args.get("limit", len(shell.state)))]
        reply = {
            "ok": True,
            "state": part,
            "total": len(shell.state),
            "generation": shell.generation,
            "workspace": shell.workspace,
        }
    elif op == "home":  # its own request: it may be as large as a file the tools move
        reply = shell.home_archive()
    elif op == "adopt":
        reply = shell.adopt(args["state"], args["workspace"], args.get("home", ""))
    elif op.startswith("python"):  # the Python tool's interpreter in this session
        reply = _pyworker.call(op, args, config, shell)
    else:
        reply = {"ok": False, "errno": "EINVAL", "message": f"unknown operation {op!r}"}
    # the caller's secret, which no process of the session can read (it travels in the
    # request, to this non-dumpable process): a line it did not write cannot carry it
    reply["token"] = config.get("token")
    print(json.dumps(reply))
