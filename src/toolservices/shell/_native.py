"""The live bash of a shell session (inside the session, standard library only).

Sent to the session with ``_supervisor`` (see there); used when the package
carries its bash builtin (``_tsbash.c``, built with the package) and the
session runs the host's bash. Instead of a fresh bash per command (1.2-1.5 ms
to start, plus the state restored from text), one bash keeps the state live
and a copy of it runs each command:

* the *root* (``ts-shell``): a bash started once per session, that loads the
  builtin, becomes non-dumpable, enters the nested Landlock domain scoped for
  signals (commands cannot signal this supervisor) and serves requests;
* a *master* (``bash``): a copy of the root that evaluated the session's
  current state (made again only when a command changed the state);
* each *command*: a copy of the master (``clone(CLONE_PARENT)``: our child, so
  its exit status is ``waitpid``'s, as for any bash we start) in its own
  process group and its own Landlock domain, that runs the command; its
  ``EXIT`` trap tells the command's status on a pipe first (the reply leaves
  then: ``_supervisor``), and saves the new state into a memfd when its
  fingerprint differs from its master's (else only ``#ts-same``). The copy for
  the next command is made while the caller is away and waits for its
  descriptors (no clone on the command's path).

The root, the masters and a waiting copy wait in ``SCHED_BATCH`` (a request
does not preempt the supervisor on its way to reply); a command's copy takes
the normal policy back.

The master is a snapshot: a command that timed out, ``exec``'d or was killed
leaves it as it was (``restarted``), and the next command is its copy again.
The state's text (what ``fork_session`` copies and a new master evaluates) is
written only when a command changed the state.

Each request is one message on a unix socket: a role byte, the descriptors'
target numbers, and the descriptors (``SCM_RIGHTS``); the answer is the copy's
pid (8 bytes), but none for the waiting copy's command (its pid is known). A
root that cannot load the builtin (or set up its Landlock layers) answers
``NOTLIVE!`` instead: the session goes on with the spawner (``_spawner``), as
where the package has no builtin.
"""

from __future__ import annotations

import array
import errno
import os
import select
import signal
import socket
import struct
import sys
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING or not __name__.startswith("_toolservices_"):  # on the host (tests)
    from toolservices.shell import _command, _procs
else:  # in a session: loaded just before this one (see ``_service._CODE``)
    _procs = sys.modules["_toolservices_shell_procs"]
    _command = sys.modules["_toolservices_shell_command"]

_PID = struct.Struct("<q")
#: the builtin's bytes, put here by the fork server's preload (``_requests``): a session on an
#: image, whose root has no copy of the package, loads it from a memfd (``Live("")``)
BUILTIN: bytes | None = None
#: the descriptor a root started from those bytes finds them at (closed once loaded)
_BUILTIN_FD = 7
#: what a root that cannot load the builtin answers instead of a pid
_NOT_LIVE = b"NOTLIVE!"
#: seconds to wait for the root or a master to answer before it is replaced
REPLY_WAIT = 5.0
#: signals Python ignores and bash must get back at their defaults
_DEFAULTS = (signal.SIGPIPE, signal.SIGXFSZ, signal.SIGINT, signal.SIGTERM, signal.SIGQUIT)

# The root's script; the copies go on from where the builtin returns. A command's copy
# finds its descriptors in place (0-2, 4 the state memfd) and its command in $__ts_cmd.
SCRIPT = (
    _command.LIVE_FUNCTIONS
    + r"""
builtin shopt -s expand_aliases  # as in an interactive terminal (the state may turn it off)
builtin enable -f "$1" __ts_serve 2>/dev/null || { builtin printf NOTLIVE! >&3; builtin exit 3; }
builtin exec 7<&-  # the builtin's memfd, where it came from one (loaded: no longer needed)
builtin shift
builtin trap __ts_save EXIT  # set once, here: every copy inherits the trap and the watch
builtin __ts_serve watch
builtin __ts_serve 3 || {
  [[ $? != 4 ]] || builtin printf NOTLIVE! >&3
  builtin trap - EXIT; builtin exit 1
}
builtin __ts_serve wait || { builtin trap - EXIT; builtin exit 1; }
RANDOM=$SRANDOM
builtin eval "$__ts_cmd"
"""
)


def library() -> str | None:
    """On the host: the builtin built with the package, or None (not built: no compiler;
    or ``TOOLSERVICES_SHELL_NATIVE=0``, which keeps the bash-per-command path)."""
    if os.environ.get("TOOLSERVICES_SHELL_NATIVE", "1") == "0":
        return None
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_tsbash.so")
    return path if os.path.isfile(path) else None


def session_library(*, on_image: bool) -> str | None:
    """The supervisor's ``native`` setting: the builtin's path; "" for a session on an image
    (its root has no copy of the package: the bytes the fork server preloaded, see
    :data:`BUILTIN`); None without a builtin."""
    path = library()
    return None if path is None else "" if on_image else path


class Unavailable(OSError):
    """The builtin cannot serve this session (its bash cannot load it, or Landlock failed)."""


class _Server:
    """The root or a master: a bash answering requests on ``sock``."""

    def __init__(self, pid: int, sock: socket.socket, generation: int = -1) -> None:
        self.pid, self.sock, self.generation = pid, sock, generation
        #: copies asked of it ahead of need whose pids it has not answered yet (in order)
        self.owed: list[_Server] = []
        self.batch = True  # the policy it waits in (see the module's docstring)

    def urgent(self, now: bool) -> None:
        """Let it preempt on wake-up (``now``: we wait for it; a task in batch policy waits
        behind a busy CPU's slice) or not (it works while we reply), if its pid is known."""
        if self.pid <= 0 or self.batch != now:
            return
        policy = os.SCHED_OTHER if now else os.SCHED_BATCH
        try:
            os.sched_setscheduler(self.pid, policy, os.sched_param(0))
        except OSError:
            return  # gone: the request tells
        self.batch = not now

    def settle(self, wait: float) -> None:
        """Read the pids it owes (before any other answer of it can be read)."""
        while self.owed:
            self.owed[0].pid = self.answer(wait)
            self.owed.pop(0)

    def send(self, role: bytes, pairs: list[tuple[int, int]]) -> None:
        fds = array.array("i", [fd for fd, _target in pairs])
        head = role + bytes([len(pairs), *(target for _fd, target in pairs)])
        self.sock.sendmsg([head], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, fds)])

    def answer(self, wait: float) -> int:
        """The pid it answers; OSError if it is gone, TimeoutError after ``wait`` seconds."""
        poller = select.poll()
        poller.register(self.sock, select.POLLIN)
        if not poller.poll(max(wait, 0.0) * 1000):
            raise TimeoutError(errno.ETIMEDOUT, "the session's bash did not answer")
        data = b""
        while len(data) < _PID.size:
            chunk = self.sock.recv(_PID.size - len(data))
            if not chunk:
                raise ConnectionError(errno.EPIPE, "the session's bash is gone")
            data += chunk
        if data == _NOT_LIVE:
            raise Unavailable(errno.ENOEXEC, "this session's bash cannot serve live")
        pid = int(_PID.unpack(data)[0])
        if pid <= 0:
            raise OSError(-pid, "the session's bash could not start a copy of itself")
        return pid

    def kill(self) -> None:
        if self.pid > 0:
            try:
                os.kill(self.pid, signal.SIGKILL)
            except OSError:
                pass
        self.sock.close()


class Live:
    """The session's live bash: its root, its current master, the master on its way and
    the copy made ahead of the next command."""

    def __init__(self, library: str, env: dict[str, str]) -> None:
        self.library, self.env = library, env
        self.root: _Server | None = None
        self.master: _Server | None = None
        #: a master asked of the root (its socket and generation), its pid not read yet
        self.coming: _Server | None = None
        #: a copy of the master made ahead of its command, waiting for its descriptors
        self.waiting: _Server | None = None

    def pids(self) -> set[int]:
        """The processes that must outlive any command (spared by a timeout's tree kill)."""
        servers = (self.root, self.master, self.coming, self.waiting)
        return {s.pid for s in servers if s is not None and s.pid > 0}

    def prepare(self, state: bytes, generation: int) -> None:
        """Have the next command's copy made now, while we reply: a master for ``state``
        (:meth:`prime`) and a copy of it that waits for its command (no wait here)."""
        self.prime(state, generation)
        if self.waiting is not None:
            if self.waiting.generation == generation:
                return
            self._drop_waiting()
        server = self.master if self.master is not None else self.coming
        assert server is not None and server.generation == generation
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        server.urgent(False)
        try:
            server.send(b"w", [(theirs.fileno(), 5)])
        except OSError:
            ours.close()
            return  # the master is gone: the next command finds out and makes another
        finally:
            theirs.close()
        self.waiting = _Server(0, ours, generation)
        server.owed.append(self.waiting)

    def _drop_waiting(self) -> None:
        """End the copy made ahead (its socket closes: it exits; one a command stopped is
        killed once its pid is known). Its master may still owe its pid: that stays owed."""
        waiting, self.waiting = self.waiting, None
        if waiting is not None:
            waiting.kill()

    def _take_waiting(self, state: bytes, generation: int, wait: float) -> _Server | None:
        """The copy made ahead for ``generation``, its pid known; None if there is none."""
        waiting = self.waiting
        if waiting is None or waiting.generation != generation:
            self._drop_waiting()
            return None
        master = self._current(state, generation, wait)
        try:
            master.settle(wait)
        except OSError:
            self._drop("master")
            self._drop_waiting()
            raise
        self.waiting = None
        if waiting.pid <= 0:  # asked of a master that died before it answered: unknown
            waiting.kill()
            return None
        return waiting

    def _start_root(self) -> _Server:
        library, blob = self.library, -1
        if not library:  # a session on an image: the builtin from the preloaded bytes
            if BUILTIN is None:
                raise Unavailable(errno.ENOENT, "no copy of the builtin in this session")
            blob = os.memfd_create("ts-builtin", os.MFD_CLOEXEC)
            _command.write_all(blob, BUILTIN)
            library = f"/proc/self/fd/{_BUILTIN_FD}"
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        argv = [_command.BASH, "--noprofile", "--norc", "-c", SCRIPT, "bash", library]
        actions = [
            (os.POSIX_SPAWN_OPEN, 0, "/dev/null", os.O_RDONLY, 0),
            (os.POSIX_SPAWN_OPEN, 1, "/dev/null", os.O_WRONLY, 0),
            (os.POSIX_SPAWN_OPEN, 2, "/dev/null", os.O_WRONLY, 0),
            (os.POSIX_SPAWN_DUP2, theirs.fileno(), 3),
        ]
        if blob >= 0:
            actions.append((os.POSIX_SPAWN_DUP2, blob, _BUILTIN_FD))
        try:
            pid = os.posix_spawn(
                argv[0], argv, self.env, file_actions=actions, setpgroup=0, setsigdef=_DEFAULTS
            )
        except OSError:
            ours.close()
            raise
        finally:
            theirs.close()
            if blob >= 0:
                os.close(blob)
        return _Server(pid, ours)

    def prime(self, state: bytes, generation: int) -> None:
        """Have the root make a master for ``state`` now, while we reply (no wait)."""
        if self.master is not None and self.master.generation == generation:
            return
        if self.coming is not None:
            if self.coming.generation == generation:
                return
            self._drop_coming()
        self._drop("master")
        if self.root is None:
            self.root = self._start_root()
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        memfd = os.memfd_create("state", os.MFD_CLOEXEC)
        try:
            _command.write_all(memfd, state)
            self.root.urgent(False)
            self.root.send(b"m", [(theirs.fileno(), 3), (memfd, 5)])
        except OSError:
            ours.close()
            root = self.root
            self.root = None
            try:  # a root that cannot serve says so, then exits: maybe before our request
                root.answer(0)
            except Unavailable:
                root.kill()
                raise
            except OSError:
                pass
            root.kill()
            _procs.reap()
            raise
        finally:
            theirs.close()
            os.close(memfd)
        self.coming = _Server(0, ours, generation)

    def _drop(self, which: str) -> None:
        server = getattr(self, which)
        setattr(self, which, None)
        if server is not None:
            server.kill()
            _procs.reap()

    def _drop_coming(self) -> None:
        """Forget the master on its way (a newer state came first): read its pid, kill it."""
        coming, self.coming = self.coming, None
        if coming is None:
            return
        if self.root is not None:
            try:  # the root answers at once, unless a command stopped it
                coming.pid = self.root.answer(1.0)
            except OSError:
                self._drop("root")  # its answers are out of step now: a new root
        coming.kill()
        _procs.reap()

    def _current(self, state: bytes, generation: int, wait: float) -> _Server:
        self.prime(state, generation)
        if self.master is None:
            coming, root = self.coming, self.root
            assert coming is not None and root is not None
            self.coming = None
            root.urgent(True)  # we wait for it now
            try:
                coming.pid = root.answer(wait)
            except OSError:
                coming.kill()
                self._drop("root")
                raise
            self.master = coming
        return self.master

    def command(
        self, pairs: list[tuple[int, int]], state: bytes, generation: int, deadline: float
    ) -> int:
        """Start a command's copy on ``pairs`` (descriptor, target); its pid.

        A bash that does not answer within :data:`REPLY_WAIT` (a command stopped
        it) or one that died (a command killed it) is replaced while ``deadline``
        allows. ``Unavailable`` when this session cannot have a live bash;
        ``TimeoutError`` at the deadline; another OSError when no bash could start
        (the process budget).
        """
        last: OSError = OSError(errno.EAGAIN, "could not start bash (process budget used up?)")
        for _attempt in range(4):
            wait = min(REPLY_WAIT, deadline - time.monotonic())
            if wait <= 0:
                raise TimeoutError(errno.ETIMEDOUT, "the session's bash did not answer")
            try:
                waiting = self._take_waiting(state, generation, wait)
                if waiting is not None:
                    try:
                        waiting.urgent(True)
                        waiting.send(b"r", pairs)
                        return waiting.pid  # no answer: the copy runs the command
                    except OSError:  # it died meanwhile (a background job killed it)
                        waiting.kill()
                    finally:
                        waiting.sock.close()
                master = self._current(state, generation, wait)
                master.settle(wait)
                master.urgent(True)
                master.send(b"c", pairs)
                return master.answer(wait)
            except Unavailable:
                self.close()
                raise
            except OSError as exc:  # gone or stopped: a new one (the next attempt)
                last = exc
                self._drop("master")
        raise last

    def close(self) -> None:
        self._drop_waiting()
        self._drop_coming()
        self._drop("master")
        self._drop("root")
