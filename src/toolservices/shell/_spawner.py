"""The spawner: the one process that starts a shell session's bash processes (inside the session).

Standard library only; sent to the session with ``_supervisor`` (see there).
The supervisor forks it once per session. It drops into a nested Landlock
domain scoped for signals and abstract sockets, so every bash it starts (and
everything those start) shares one domain: a command can signal the
background jobs of earlier commands, never the supervisor, which stays
outside. For each request (six descriptors: stdin, stdout, stderr, the
command pipe, the memfds for the state out and in) it forks a short-lived middle
process that ``posix_spawn``s bash in its own process group and exits, so
bash is re-parented to the supervisor (a child subreaper), which alone
waits for its exit status. The reply is bash's pid, once the middle is gone.

The middle process first enters a further Landlock domain of its own (it
restricts nothing the session may do): Landlock lets a process trace, read
the memory or open the descriptors (``/proc/<pid>/{mem,fd}``,
``pidfd_getfd``) only of processes in its own domain or below it, so each
bash and what it starts are out of reach of every other command's
processes: a background job cannot write the command pipe, the output pipes
or the memory of the bash waiting for the next command. Signals still
reach them (``kill`` of an earlier job works).
"""

from __future__ import annotations

import array
import ctypes
import fcntl
import os
import select
import signal
import socket
import struct
from typing import Any

_PR_SET_DUMPABLE = 4
_SYS_LANDLOCK_CREATE_RULESET = 444
_SYS_LANDLOCK_ADD_RULE = 445
_SYS_LANDLOCK_RESTRICT_SELF = 446
_RULE_PATH_BENEATH = 1
_FS_EXECUTE = 1
_FS_REFER = 1 << 13  # Landlock ABI 2
_SCOPE_ALL = 3  # abstract unix sockets | signals (Landlock ABI 6)
_PID = struct.Struct("<q")
_NFDS = 6
#: seconds to wait for a bash to be started before the spawner is replaced
_REPLY_WAIT = 5.0
#: signals Python ignores and bash must get back at their defaults
_DEFAULTS = (signal.SIGPIPE, signal.SIGXFSZ, signal.SIGINT, signal.SIGTERM, signal.SIGQUIT)


class _Scope(ctypes.Structure):
    _fields_ = [("fs", ctypes.c_uint64), ("net", ctypes.c_uint64), ("scoped", ctypes.c_uint64)]


class _Beneath(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("allowed", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


def _ruleset(lib: Any, rights: int, scoped: int, size: int) -> int:
    """A Landlock ruleset that handles ``rights`` and grants them all beneath ``/`` (only
    the session's own domain decides what they reach), scoping ``scoped``: its descriptor."""
    attr = _Scope(rights, 0, scoped)
    fd = lib.syscall(_SYS_LANDLOCK_CREATE_RULESET, ctypes.byref(attr), size, 0)
    if fd < 0:
        raise OSError(ctypes.get_errno(), "landlock_create_ruleset")
    try:
        root = os.open("/", os.O_PATH | os.O_CLOEXEC)
        try:
            rule = _Beneath(rights, root)
            if lib.syscall(_SYS_LANDLOCK_ADD_RULE, fd, _RULE_PATH_BENEATH, ctypes.byref(rule), 0):
                raise OSError(ctypes.get_errno(), "landlock_add_rule")
        finally:
            os.close(root)
    except OSError:
        os.close(fd)
        raise
    return int(fd)


def _restrict(lib: Any, ruleset: int) -> None:
    """Enter the nested Landlock domain of ``ruleset``."""
    if lib.syscall(_SYS_LANDLOCK_RESTRICT_SELF, ruleset, 0) != 0:
        raise OSError(ctypes.get_errno(), "landlock_restrict_self")


def _enter_domain(lib: Any, rights: int, scoped: int, size: int) -> None:
    """Enter a nested Landlock domain made for this once (see :func:`_ruleset`)."""
    fd = _ruleset(lib, rights, scoped, size)
    try:
        _restrict(lib, fd)
    finally:
        os.close(fd)


def scope_signals(lib: Any) -> bool:
    """Enter a nested Landlock domain that only scopes signals and sockets; False without ABI 6.

    Any ruleset denies moving a file to another directory (EXDEV: rename, link)
    unless it grants ``LANDLOCK_ACCESS_FS_REFER`` by a rule: this one grants it
    everywhere, so only the session's own domain decides (pip's wheel builds and
    git rename across directories).
    """
    if lib.syscall(_SYS_LANDLOCK_CREATE_RULESET, None, 0, 1) < 6:
        return False
    _enter_domain(lib, _FS_REFER, _SCOPE_ALL, ctypes.sizeof(_Scope))
    return True


def own_ruleset(lib: Any) -> int:
    """The ruleset of a Landlock domain of one's own that denies nothing; -1 without Landlock.

    A ruleset must handle some right: it handles ``execute`` (and, from ABI 2,
    ``refer``, which a ruleset would otherwise deny implicitly) and grants them
    beneath ``/``, where the session's own layers decide. What the new domain
    changes is who may trace us (see the module's docstring). Made once, entered
    by every bash's middle process (making it each time cost ~0.1 ms more).
    """
    abi = lib.syscall(_SYS_LANDLOCK_CREATE_RULESET, None, 0, 1)
    if abi < 1:
        return -1
    rights = _FS_EXECUTE | (_FS_REFER if abi >= 2 else 0)
    return _ruleset(lib, rights, 0, ctypes.sizeof(ctypes.c_uint64))  # ABI 1's struct: fs only


def own_domain(lib: Any) -> bool:
    """Enter a Landlock domain of our own that denies nothing; False without Landlock."""
    fd = own_ruleset(lib)
    if fd < 0:
        return False
    try:
        _restrict(lib, fd)
    finally:
        os.close(fd)
    return True


class Spawner:
    """The supervisor's handle on its spawner process."""

    def __init__(self, argv: list[str], env: dict[str, str], cwd: str) -> None:
        self.argv, self.env, self.cwd = argv, env, cwd
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        pid = os.fork()
        if pid == 0:  # pragma: no cover - runs in the spawner
            try:
                ours.close()
                _serve(theirs, argv, env, cwd)
            finally:
                os._exit(0)
        theirs.close()
        # a spawner stopped or wedged by a command (kill -STOP) must not hang the session
        ours.settimeout(_REPLY_WAIT)
        self.sock, self.pid = ours, pid

    def request(self, fds: list[int]) -> None:
        """Ask for one bash on ``fds``: stdin, stdout, stderr, command pipe, state out, state in."""
        self.sock.sendmsg([b"S"], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))])

    def reply(self) -> int:
        """The pid of the bash asked for (re-parented to us by now).

        OSError if the spawner died or did not answer within ``_REPLY_WAIT``.
        """
        # (a poll: a peek on this socket would wait for its timeout first)
        poller = select.poll()
        poller.register(self.sock, select.POLLIN)
        ready = poller.poll(0)
        if not ready:
            # still at work in batch policy (waiting behind any busy CPU for a whole slice):
            # we wait for it now, so it gets the normal policy until it answers
            try:
                os.sched_setscheduler(self.pid, os.SCHED_OTHER, os.sched_param(0))
            except OSError:
                pass
        data = b""
        while len(data) < _PID.size:
            chunk = self.sock.recv(_PID.size - len(data))
            if not chunk:
                raise ConnectionError("the spawner is gone")
            data += chunk
        pid = int(_PID.unpack(data)[0])
        if pid <= 0:
            raise OSError(-pid, "the spawner could not start bash")
        return pid

    def close(self) -> None:
        """Forget it (its process ends when the socket closes; a fork's copy never kills it)."""
        self.sock.close()

    def kill(self) -> None:
        """Kill it (it may be stopped, when closing its socket would not end it) and forget it."""
        try:
            os.kill(self.pid, signal.SIGKILL)
        except OSError:
            pass
        self.close()


def _serve(sock: socket.socket, argv: list[str], env: dict[str, str], cwd: str) -> None:
    lib = ctypes.CDLL(None, use_errno=True)
    lib.prctl(_PR_SET_DUMPABLE, 0, 0, 0, 0)  # its /proc/<pid>/fd stays closed to the commands
    keep = sock.fileno()
    os.closerange(3, keep)
    os.closerange(keep + 1, 1 << 16)
    os.chdir(cwd)
    scope_signals(lib)
    ruleset = own_ruleset(lib)  # each bash's own domain, entered by its middle process
    # Woken by a request, it must not preempt the supervisor on its way to reply (that
    # cost the reply ~0.6 ms): it waits for requests in batch policy (no preemption on
    # wake-up) and works in the normal one; if the supervisor needs the answer before it
    # ran, it lifts the batch policy itself (``Spawner.reply``).
    batch = True
    space = socket.CMSG_SPACE(_NFDS * 4)
    while True:
        if batch:
            try:
                os.sched_setscheduler(0, os.SCHED_BATCH, os.sched_param(0))
            except OSError:
                batch = False
        try:
            msg, anc, _flags, _addr = sock.recvmsg(1, space, socket.MSG_CMSG_CLOEXEC)
        except OSError:
            return
        if not msg:
            return
        if batch:  # awake: the middle process and bash (which inherit it) get the normal one
            try:
                os.sched_setscheduler(0, os.SCHED_OTHER, os.sched_param(0))
            except OSError:
                pass
        got: list[int] = []
        for level, kind, data in anc:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                got.extend(array.array("i", data[: len(data) - len(data) % 4]))
        # above the targets 0..5, so that no dup2 overwrites a later one's source
        fds = [fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 16) for fd in got]
        for fd in got:
            os.close(fd)
        try:
            pid = _spawn(lib, argv, env, fds, ruleset) if len(fds) == _NFDS else -22
        finally:
            for fd in fds:
                os.close(fd)
        sock.sendall(_PID.pack(pid))


def _spawn(lib: Any, argv: list[str], env: dict[str, str], fds: list[int], ruleset: int) -> int:
    """Start bash through a middle process that exits at once; bash's pid or -errno."""
    r, w = os.pipe2(os.O_CLOEXEC)
    try:
        middle = os.fork()
    except OSError as exc:
        os.close(r)
        os.close(w)
        return -(exc.errno or 11)
    if middle == 0:  # pragma: no cover - the middle process
        try:
            if ruleset >= 0:
                _restrict(lib, ruleset)  # out of reach of the other commands' processes
            actions = [(os.POSIX_SPAWN_DUP2, fd, target) for target, fd in enumerate(fds)]
            pid = os.posix_spawn(
                argv[0],
                argv,
                env,
                file_actions=actions,
                setpgroup=0,
                setsigdef=_DEFAULTS,
            )
        except OSError as exc:
            pid = -(exc.errno or 11)
        except BaseException:
            pid = -5
        try:
            os.write(w, _PID.pack(pid))
        finally:
            os._exit(0)
    os.close(w)
    try:
        data = os.read(r, _PID.size)
    finally:
        os.close(r)
        os.waitpid(middle, 0)
    return int(_PID.unpack(data)[0]) if len(data) == _PID.size else -5
