"""The shell supervisor: runs inside a sandboxed Python session, standard library only.

The host never imports this module: it sends its source once to each session
(``ShellService`` execs it there), so it runs with exactly the session's
rights (uid, rlimits, namespaces, Landlock, seccomp). It holds the shell state
of one session (a bash script that restores variables, functions, aliases,
options and the working directory) and runs each command in a bash of its
own, its child: a copy of the session's live bash, which holds that state
(``_native``, where the package's bash builtin loads), or else a fresh bash
from the spawner (``_spawner``) that restored the state from a private memfd
before the command arrived (``_command``). On exit the command's bash writes
the new state into another private memfd. So:

* the exit status is bash's own exit status, seen by ``waitpid``, or told by a
  live bash's copy at the start of its ``EXIT`` trap (the status it exits with;
  the reply then leaves while it saves the state: :meth:`Shell.settle` takes
  that after the reply): nothing the command prints, closes or redirects can
  end it early or fake it;
* ``exit``, ``exec``, ``kill -9 $$`` end only that bash; the next command gets
  another, from the last state saved (``restarted`` says when this command's
  changes could not be saved);
* each bash runs in its own process group and Landlock domain, nested in one
  scoped for signals: commands can signal each other's processes, never this
  supervisor (see ``_command``, ``_procs`` for timeouts, ``_files`` for the
  file tools);
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
import sys
import time
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING or not __name__.startswith("_toolservices_"):  # on the host (tests)
    from toolservices.shell import _command, _files, _native, _procs, _pyworker, _terminal
    from toolservices.shell._spawner import Spawner
else:  # in a session: loaded just before this one (see ``_service._CODE``)
    _procs = sys.modules["_toolservices_shell_procs"]
    _files = sys.modules["_toolservices_shell_files"]
    _terminal = sys.modules["_toolservices_shell_terminal"]
    _command = sys.modules["_toolservices_shell_command"]
    _native = sys.modules["_toolservices_shell_native"]
    _pyworker = sys.modules["_toolservices_shell_python"]
    Spawner = sys.modules["_toolservices_shell_spawner"].Spawner

_MAX_LINGERING = 64
#: seconds a command's copy that answered may take to save the state before it is killed
#: (and the next command says ``restarted``): a 23 MB variable takes well under one
_SAVE_WAIT = 5.0
_PR_SET_DUMPABLE = 4
_libc: Any = None


def _lib() -> Any:
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(None, use_errno=True)
    return _libc


class Shell:
    """One session's shell: its saved state, its workspace, its live bash or its spawner."""

    def __init__(
        self,
        workspace: str,
        *,
        max_output: int,
        max_file: int,
        command_stack: int | None = None,
        offline: bool = True,
        start_dir: str | None = None,
        native: str | None = None,
    ) -> None:
        _terminal.command_limits(command_stack)  # inherited by every bash we start
        self.workspace = workspace
        self.home = _terminal.make_home(workspace)
        self.offline = offline
        self.max_output = max_output
        self.max_file = max_file
        # the first command's bash starts in the workspace, or in ``start_dir`` (an
        # image's WorkingDir, made if the image lacks it, as docker does); later ones
        # where the previous command left off (the saved state's ``cd``)
        self.state = "" if not start_dir else _command.start_state(start_dir)
        # the fingerprint of ``state`` (``_command.fingerprint``): a copy whose state still
        # has it saves nothing
        self.fingerprint = 0
        # bumped at each change of ``state``: a spare primed with another generation is stale
        self.generation = 0
        self.pid = os.getpid()
        _lib().prctl(_PR_SET_DUMPABLE, 0, 0, 0, 0)
        self.spawner: Spawner | None = None
        self.pending: _command.Spare | None = None
        # the live bash (``_native``) where the package's builtin can serve; else a fresh
        # bash per command from the spawner
        self.live = None if native is None else _native.Live(native, self._env())
        self._encoded = (-1, b"")  # the state as bytes, and its generation
        # a live bash's copy that answered (``__ts_serve done``) and is saving the state: its
        # pidfd and state memfd, taken by ``settle`` after the reply (``after_reply``)
        self.saving: tuple[int, int] | None = None
        # news for the next command: the state a copy saved after it answered was lost
        self.unsaved = False
        # stdout/stderr pipes of finished commands that background jobs still hold: kept
        # open and drained, so that a job printing later is not killed by SIGPIPE
        self.lingering: list[int] = []

    # --- commands ------------------------------------------------------------------

    def home_archive(self) -> dict[str, Any]:
        """HOME as a base64 tar, for ``fork_session`` (empty when HOME is the workspace)."""
        if self.home == self.workspace or not os.path.isdir(self.home):
            return {"ok": True, "home": ""}
        reply = _files.get_archive(self.home, self.max_file, arcname=".")
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
        if not state.endswith(_command.STATE_END + "\n"):
            return {"ok": False, "errno": "EINVAL", "message": "not a saved shell state"}
        if source != self.workspace:
            state = state.replace(source, self.workspace)
        if home:
            copied = _files.put_archive(self.home, home)
            if not copied["ok"]:
                return {**copied, "message": f"cannot copy HOME: {copied['message']}"}
        self.state = state
        self.fingerprint = _command.fingerprint(state)
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

    def _env(self) -> dict[str, str]:
        return _terminal.command_env(dict(os.environ), self.home, self.offline)

    def _state_bytes(self) -> bytes:
        if self._encoded[0] != self.generation:
            self._encoded = (self.generation, self.state.encode("utf-8", "surrogateescape"))
        return self._encoded[1]

    def _request_spare(self) -> None:
        """Ask the spawner for the next command's bash; it starts while we reply."""
        if self.spawner is None:
            argv = [_command.BASH, "--noprofile", "--norc", "-c", _command.PRELUDE, "bash"]
            self.spawner = Spawner(argv, self._env(), self.workspace)
        spare, (in_r, out_w, err_w) = _command.streams()
        cmd_r, spare.cmd_w = os.pipe2(os.O_CLOEXEC)
        spare.state_in = os.memfd_create("state-in", os.MFD_CLOEXEC)
        try:
            self.spawner.request([in_r, out_w, err_w, cmd_r, spare.state_out, spare.state_in])
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
        _procs.reap()

    def _take_spare(self) -> _command.Spare:
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
            if _procs.state(spare.pid) in (b"Z", b"X"):
                # killed with the tree of the previous command (timeout, waiting for keys),
                # which it looked part of: reap it and use another
                _procs.reap()
                spare.close()
                continue
            if _procs.parent(spare.pid) != os.getpid():
                # started while we were not a subreaper (fork_session clears it for a moment):
                # someone else reaps it, so we could not learn its status. Use another.
                _procs.killpg(spare.pid)
                spare.close()
                continue
            if spare.generation == -1:
                self._prime(spare)
            if spare.generation != self.generation:  # dead, or restored another state
                _procs.killpg(spare.pid)
                spare.close()
                continue
            return spare
        raise OSError(errno.EAGAIN, "could not start bash (process budget used up?)")

    def prepare_next(self) -> None:
        """Start the next command's bash and have it restore the state while we reply."""
        if self.live is not None:
            try:
                self.live.prepare(self._state_bytes(), self.generation)
                return
            except _native.Unavailable:  # this bash cannot load the builtin: the spawner's way
                self.live = None
            except OSError:
                return  # asked again (and reported) by the next command
        if self.pending is None:
            try:
                self._request_spare()
            except OSError:
                return  # asked again (and reported) by the next command
        assert self.pending is not None
        if self.pending.generation == -1:
            self._prime(self.pending)

    def _prime(self, spare: _command.Spare) -> None:
        spare.prime(self._state_bytes(), self.generation)

    def _discard_pending(self) -> None:
        """Drop the spare asked for while the command ran (it was born after the command,
        so the timeout's tree kill may have hit it: a later command must not get a dead bash)."""
        stale, self.pending = self.pending, None
        if stale is None:
            return
        try:
            if self.spawner is not None:
                stale.pid = self.spawner.reply()
                _procs.killpg(stale.pid)
        except OSError:
            self._drop_spawner()
        stale.close()

    def _launch(self, command: str, stdin: bytes | None, deadline: float) -> _command.Spare:
        """The command's bash, started, with the writes it waits for (see ``collect``).

        A copy of the live bash where there is one (its command in a memfd), else a
        spare from the spawner (its command written to its pipe).
        """
        if self.live is not None:
            launched, (in_r, out_w, err_w) = _command.streams()
            launched.done_r, done_w = os.pipe2(os.O_CLOEXEC)
            text = os.memfd_create("command", os.MFD_CLOEXEC)
            try:
                head = b"%016x\n" % self.fingerprint  # the state the copy comes from
                _command.write_all(text, head + command.encode("utf-8", "surrogateescape"))
                state = launched.state_out
                pairs = [(in_r, 0), (out_w, 1), (err_w, 2), (text, 3), (state, 4), (done_w, 6)]
                launched.pid = self.live.command(
                    pairs, self._state_bytes(), self.generation, deadline
                )
                return launched
            except _native.Unavailable:  # this bash cannot load the builtin: the spawner's way
                self.live = None
                launched.close()
            except OSError:
                launched.close()
                raise
            finally:
                for fd in (in_r, out_w, err_w, text, done_w):
                    os.close(fd)
        spare = self._take_spare()
        spare.writes = {spare.cmd_w: b"__ts_cmd=" + _command.quote(command) + b"\n"}
        spare.cmd_w = -1
        return spare

    @staticmethod
    def _not_started(timeout: float, started: float) -> dict[str, Any]:
        """The result of a command whose bash, stopped by an earlier command, never took it."""
        return {
            "no_terminal": "",
            "returncode": -1,
            "timed_out": True,
            "restarted": True,
            "stdout": "",
            "stderr": "",
            "stdout_total": 0,
            "stderr_total": 0,
            "duration": time.monotonic() - started,
            "limit": timeout,
        }

    def _spared(self) -> set[int]:
        """The session's own processes that no command's tree kill may take."""
        spared = set() if self.live is None else self.live.pids()
        if self.spawner is not None:
            spared.add(self.spawner.pid)
        return spared

    def _take_state(self, saved: bytes) -> bool:
        """Adopt the state a command's bash saved; False if it is incomplete (not saved)."""
        if saved == _command.SAME:  # a live bash's copy whose state is the one it came from
            return True
        text = _terminal.compact_limits(saved.decode("utf-8", "surrogateescape"))
        if not text.endswith(_command.STATE_END + "\n"):
            return False
        if text != self.state:
            self.state = text
            self.fingerprint = _command.fingerprint(text)
            self.generation += 1
        return True

    def settle(self) -> None:
        """Take the state the last command's copy saved after it answered (see :meth:`run`):
        wait for it to exit (at most ``_SAVE_WAIT``: then it is killed and the next command
        says ``restarted``)."""
        saving, self.saving = self.saving, None
        if saving is None:
            return
        pidfd, state_out = saving
        try:
            poller = select.poll()
            poller.register(pidfd, select.POLLIN)
            if not poller.poll(_SAVE_WAIT * 1000):
                signal.pidfd_send_signal(pidfd, signal.SIGKILL)
                poller.poll(_SAVE_WAIT * 1000)  # SIGKILL: it exits now (what it saved: partial)
            saved = _command.read_all(state_out)
        finally:
            os.close(pidfd)
            os.close(state_out)
        _procs.reap()  # the copy, whose status it told
        if not self._take_state(saved):
            self.unsaved = True

    def after_reply(self) -> None:
        """Run by the session after the reply went (``AFTER_REPLY``): the state saved, the
        next command's copy on its way from the master of that state."""
        self.settle()
        self.prepare_next()

    def run(self, command: str, timeout: float, stdin: bytes | None) -> dict[str, Any]:
        self.settle()
        started = time.monotonic()
        self._drain_lingering()
        # the command's processes start from now on (a spare bash started earlier is in its
        # group): what its tree kill may take (see ``_procs.kill_tree``)
        born = _procs.now_ticks()
        try:
            launched = self._launch(command, stdin, started + timeout)
        except TimeoutError:  # a stopped bash did not answer: the command never started
            return self._not_started(timeout, started)
        pid = launched.pid
        # Background jobs of earlier commands, reparented to us: never this command's,
        # even when they forked after this command's bash was started as a spare.
        earlier = _procs.children(self.pid, self._spared())
        pidfd = -1
        try:
            pidfd = os.pidfd_open(pid)
            # Written from the poll loop: a stopped bash (kill -STOP) cannot block us.
            writes = {**launched.writes, launched.in_w: stdin or b""}
            launched.in_w = -1
            left = max(started + timeout - time.monotonic(), 0.0)
            status, outs, timed_out, stuck, answered = _command.collect(
                pid,
                launched.out_r,
                launched.err_r,
                writes,
                left,
                self.max_output,
                pidfd=pidfd,
                done_r=launched.done_r,
            )
            if timed_out or stuck:
                _procs.kill_tree(self.pid, pid, born, self._spared(), earlier)
                self._discard_pending()
            if answered:  # its bash saves the state while we reply: ``settle`` takes it
                self.saving = (pidfd, launched.state_out)
                pidfd = launched.state_out = -1
                saved = b""
            else:
                saved = _command.read_all(launched.state_out)
            kept = (launched.out_r, launched.err_r)
            launched.out_r = launched.err_r = -1
            self._drain_lingering(kept)
        finally:
            if pidfd >= 0:
                os.close(pidfd)
            launched.close()
        # a copy that answered saves the state after the reply: lost, the next command says so
        lost = not answered and (timed_out or bool(stuck) or not self._take_state(saved))
        restarted, self.unsaved = lost or self.unsaved, False
        if not answered:  # else after the reply, once the state is known (``after_reply``)
            self.prepare_next()
        _procs.reap()
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

    # --- files ---------------------------------------------------------------------

    def _path(self, path: str) -> str:
        return os.path.join(self.workspace, path)


_shell: Shell | None = None


def request(text: str) -> Any:
    """The entry point of every request: a JSON object of ``op``, ``args`` and ``config``
    (one string literal in the request's source: cheap to compile). See :func:`call`."""
    parsed = json.loads(text)
    return call(parsed["op"], parsed["args"], parsed["config"])


def call(op: str, args: dict[str, Any], config: dict[str, Any]) -> Any:
    """Entry point of every request: one JSON line on stdout. Returns what the session runs
    after the reply (``AFTER_REPLY``), or None."""
    global _shell
    if _shell is None:
        _shell = Shell(
            os.getcwd(),
            max_output=config["max_output"],
            max_file=config["max_file"],
            command_stack=config.get("command_stack"),
            offline=config.get("offline", True),
            start_dir=config.get("start_dir"),
            native=config.get("native"),
        )
    shell = _shell
    shell.settle()  # every request sees the last command's state (normally taken already)
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
        reply = _files.write_file(shell._path(args["path"]), args["data"], args.get("mode", 0o644))
    elif op == "read":
        reply = _files.read_file(shell._path(args["path"]), shell.max_file)
    elif op == "list":
        reply = _files.list_files(shell._path(args["path"]), args["limit"])
    elif op == "put_archive":
        reply = _files.put_archive(shell._path(args["path"]), args["data"])
    elif op == "get_archive":
        reply = _files.get_archive(shell._path(args["path"]), shell.max_file)
    elif op == "warm":  # a spare interpreter, ahead of need: the first bash starts now
        # and runs one command (its state saved and read back into a master: what the first
        # command would wait for, and the code paths a first command faults in)
        shell.run("true", 10.0, None)
        shell.after_reply()
        # give back what loading the supervisor left free in the heap (about 0.35 MiB a
        # session: the bootstrap's source and its compilation)
        _lib().malloc_trim(0)
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
    return shell.after_reply if shell.saving is not None else None
