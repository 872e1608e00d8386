"""The session worker: runs user code in a forked interpreter.

It lives in a child forked by the fork server (or by another session, for
``fork_session``) and serves one private channel: ``EXEC`` frames in, one
``RESULT`` frame out per call, with the same sequence number.

User output never travels on the channel. ``sys.stdout``/``sys.stderr`` and
file descriptors 1 and 2 all write into two memfds (anonymous in-memory
files) whose descriptors the parent received in ``HELLO``; the parent reads
them with ``pread`` after the reply, or after a kill, so partial output
survives timeouts and crashes and whatever the code prints cannot be mistaken
for a frame. Python-level writes are capped per call; fd-level writes (C
extensions, subprocesses) are bounded by ``RLIMIT_FSIZE`` and cut by the parent.
"""

from __future__ import annotations

import _thread
import ctypes
import faulthandler
import io
import linecache
import os
import resource
import shutil
import signal
import socket
import sys
import time
import traceback
import types
from typing import Any, NoReturn

from ._confine import enter_copy, fixed_workspace, own_pids
from ._linux import die_with_parent, libc, set_subreaper
from ._protocol import (
    AFTER_REPLY,
    EXIT_BROKEN,
    Error,
    Exec,
    Fork,
    Forked,
    Frame,
    Hello,
    Kind,
    Result,
    recv_frame,
    send_message,
)

__all__ = ["serve_session", "set_default_thread_stack"]

MAX_REQUEST = 1 << 28  # 256 MiB of source code is already absurd
MAX_EXC_MESSAGE = 2000
COMPILE_CACHE = 128
#: a traceback deeper than this shows its innermost TRACEBACK_TAIL frames and a count of
#: the rest: formatting a million-frame traceback takes longer than any timeout
TRACEBACK_FULL = 200
TRACEBACK_TAIL = 100
#: the highest ``sys.setrecursionlimit`` honoured. Python 3.11 counts Python calls and C
#: recursion (``repr``, ``json``, ``==``, a ``__repr__`` calling ``repr``...) against this one
#: limit, so it bounds both: ``repr`` of nested lists is quadratic in the depth (0.4 s of
#: CPU at this cap, 0.9 s at 50,000), and the C stack it needs is this many levels of the
#: worst transition (see MAIN_STACK and THREAD_STACK; docs/sandbox.md has the figures).
RECURSION_CAP = 30_000
#: the main thread's stack (``SandboxConfig.stack_size``, ``RLIMIT_STACK``): RECURSION_CAP
#: levels at 4.4 KiB each (``sorted`` with a recursing key or ``__lt__``, the deepest
#: measured, takes 2.5 KiB); only what a recursion touches is memory
MAIN_STACK = 128 << 20
#: threads' default stack: RECURSION_CAP levels at 1.1 KiB each (a Python ``__getattr__``,
#: ``__add__`` or ``__format__`` recursing through C takes up to 730 bytes); glibc would
#: size thread stacks like the main thread's limit, each reserving that much address space
THREAD_STACK = 32 << 20
_libc = libc()
# bound once: user code that patches os (os.write = None) must not break the worker
_write, _fstat, _dup2, _ftruncate, _lseek = os.write, os.fstat, os.dup2, os.ftruncate, os.lseek
_perf_counter, _yield = time.perf_counter, os.sched_yield
_PEEK = socket.MSG_PEEK | socket.MSG_DONTWAIT


def set_default_thread_stack(size: int = THREAD_STACK) -> None:
    """New threads get ``size`` bytes of stack, whatever ``RLIMIT_STACK`` says.

    glibc takes its default thread stack size from ``RLIMIT_STACK``, which the
    launcher raises for the main thread: without this each thread would reserve
    that much address space (counted by ``RLIMIT_AS``).
    """
    attr = ctypes.create_string_buffer(128)  # pthread_attr_t is 56 bytes on 64-bit glibc
    try:
        init = _libc.pthread_attr_init
        set_size = _libc.pthread_attr_setstacksize
        set_default = _libc.pthread_setattr_default_np
    except AttributeError:  # not glibc: its own default applies
        return
    if init(attr) == 0:
        try:
            if set_size(attr, ctypes.c_size_t(size)) == 0:
                set_default(attr)
        finally:
            _libc.pthread_attr_destroy(attr)


def recursion_cap() -> int:
    """RECURSION_CAP, or fewer levels when a smaller ``stack_size`` cannot hold that many.

    Never below CPython's default of 1,000: ordinary code must run as on a
    plain interpreter.
    """
    limit = resource.getrlimit(resource.RLIMIT_STACK)[0]
    if limit == resource.RLIM_INFINITY or limit >= MAIN_STACK:
        return RECURSION_CAP
    return max(1000, limit * RECURSION_CAP // MAIN_STACK)


def cap_recursion_limit(cap: int = RECURSION_CAP) -> None:
    """Make ``sys.setrecursionlimit`` clamp to ``cap``: a runaway recursion ends within a second.

    Code that goes out of its way to reach the original function (its
    closure) gets the old behaviour back: a crash the executor reports, or
    its timeout.
    """
    original = sys.setrecursionlimit

    def setrecursionlimit(limit: int, /) -> None:
        original(min(limit, cap) if isinstance(limit, int) and limit > 0 else limit)

    setrecursionlimit.__doc__ = original.__doc__
    sys.setrecursionlimit = setrecursionlimit


def cap_thread_stacks() -> None:
    """Threads get THREAD_STACK by default and ``threading.stack_size`` clamps to a safe range.

    Below THREAD_STACK a thread could not hold RECURSION_CAP levels of C
    recursion and would crash instead of raising ``RecursionError``; above
    ``RLIMIT_STACK`` it would get more stack than the main thread (the limit
    the configuration chose). ``stack_size(0)`` still means the default.
    """
    limit = resource.getrlimit(resource.RLIMIT_STACK)[0]
    ceiling = None if limit == resource.RLIM_INFINITY else limit
    floor = THREAD_STACK if ceiling is None else min(THREAD_STACK, ceiling)
    set_default_thread_stack(floor)
    original = _thread.stack_size

    def stack_size(size: int = 0, /) -> int:
        if isinstance(size, int) and size > 0:
            size = max(size, floor) if ceiling is None else min(max(size, floor), ceiling)
        return original(size)

    stack_size.__doc__ = original.__doc__
    _thread.stack_size = stack_size
    threading = sys.modules.get("threading")
    if threading is not None:  # it copied the function when imported
        threading.stack_size = stack_size  # type: ignore[attr-defined]


class _CappedFd(io.RawIOBase):
    """Raw writer into one memfd that keeps at most ``cap`` bytes per call.

    The worker passes one byte more than the parent shows: a file longer than
    the parent's cap tells it the output was cut even when the call never
    reported (a timeout in the middle of a flood).
    """

    def __init__(self, fd: int, cap: int) -> None:
        super().__init__()
        self.fd = fd
        self.cap = cap
        self.written = 0
        self.dropped = 0

    def writable(self) -> bool:
        return True

    def write(self, b: Any) -> int:
        data = memoryview(b).cast("B")
        n = len(data)
        room = self.cap - self.written
        if room <= 0:
            self.dropped += n
            return n
        keep = data[:room]
        while keep:
            done = _write(self.fd, keep)
            self.written += done
            keep = keep[done:]
        self.dropped += max(0, n - room)
        return n


def _text_stream(raw: _CappedFd, *, line_buffering: bool) -> io.TextIOWrapper:
    return io.TextIOWrapper(
        io.BufferedWriter(raw, 8192),
        encoding="utf-8",
        errors="backslashreplace",
        line_buffering=line_buffering,
        write_through=not line_buffering,
    )


class _Worker:
    def __init__(self, chan: socket.socket, max_output: int, busy_poll: float = 0.0) -> None:
        self.chan = chan
        self.max_output = max_output
        self.busy_poll = busy_poll
        self._hot = False  # the last call came within busy_poll of the reply before it
        self.pid = os.getpid()
        self.calls = 0
        self._compiled: dict[str, types.CodeType] = {}
        self._dirty = (True, True)
        self.devnull = os.open(os.devnull, os.O_RDWR | os.O_CLOEXEC)
        module = types.ModuleType("__main__")
        module.__dict__["__builtins__"] = __builtins__
        sys.modules["__main__"] = module
        self.globals: dict[str, Any] = module.__dict__
        self._new_outputs()

    # --- set-up -------------------------------------------------------------------

    def _new_outputs(self) -> None:
        """Fresh memfds for this interpreter (also in a forked copy)."""
        self.out_fd = os.memfd_create("stdout", os.MFD_CLOEXEC)
        self.err_fd = os.memfd_create("stderr", os.MFD_CLOEXEC)
        self.ids = (os.fstat(self.out_fd).st_ino, os.fstat(self.err_fd).st_ino)
        self.out_raw = _CappedFd(self.out_fd, self.max_output + 1)
        self.err_raw = _CappedFd(self.err_fd, self.max_output + 1)
        self.out = _text_stream(self.out_raw, line_buffering=True)
        self.err = _text_stream(self.err_raw, line_buffering=False)
        self.stdin = open(os.devnull, encoding="utf-8")  # noqa: SIM115 - lives with the worker

    def hello(self, *, namespaces: bool = True) -> None:
        """Say HELLO with the output memfds and, in a session of its own at the fixed
        workspace, descriptors of its user and mount namespaces (``spawn_with_files``)."""
        extra: list[int] = []
        try:
            if namespaces and fixed_workspace():
                for name in ("user", "mnt"):
                    extra.append(os.open(f"/proc/self/ns/{name}", os.O_RDONLY | os.O_CLOEXEC))
            send_message(self.chan, Hello(self.pid), 0, (self.out_fd, self.err_fd, *extra))
        finally:
            for fd in extra:
                os.close(fd)

    def _own_fds_intact(self) -> bool:
        try:
            out, err = _fstat(self.out_fd), _fstat(self.err_fd)
        except OSError:
            return False
        self._dirty = (out.st_size > 0, err.st_size > 0)
        return (out.st_ino, err.st_ino) == self.ids

    def _reset_stdio(self) -> None:
        """Undo whatever the previous call did to stdin/stdout/stderr."""
        for fd, dirty in zip((self.out_fd, self.err_fd), self._dirty, strict=True):
            if dirty:
                _ftruncate(fd, 0)
                _lseek(fd, 0, os.SEEK_SET)
        _dup2(self.devnull, 0)
        _dup2(self.out_fd, 1)
        _dup2(self.err_fd, 2)
        for raw in (self.out_raw, self.err_raw):
            raw.written = raw.dropped = 0
        if self.out.closed or self.err.closed:
            self.out_raw = _CappedFd(self.out_fd, self.max_output + 1)
            self.err_raw = _CappedFd(self.err_fd, self.max_output + 1)
            self.out = _text_stream(self.out_raw, line_buffering=True)
            self.err = _text_stream(self.err_raw, line_buffering=False)
        if self.stdin.closed:
            self.stdin = open(os.devnull, encoding="utf-8")  # noqa: SIM115
        sys.stdin, sys.stdout, sys.stderr = self.stdin, self.out, self.err

    # --- one call -----------------------------------------------------------------

    def run(self, code: str) -> Result:
        if not self._own_fds_intact():
            return Result(fatal="the output capture files were closed or replaced")
        self._reset_stdio()
        exc_info: dict[str, str] | None = None
        rc = 0
        start = time.perf_counter()
        try:
            exec(self._compile(code), self.globals)
        except SystemExit as exc:
            rc = self._exit_code(exc)
            exc_info = {"type": "SystemExit", "message": _safe_str(exc)}
        except BaseException as exc:  # user code may raise anything, KeyboardInterrupt included
            rc = 1
            exc_info = {"type": _type_name(exc), "message": _safe_str(exc)}
            self._print_traceback(exc)
        duration = time.perf_counter() - start
        if os.getpid() != self.pid:  # a child the code forked came back here: not ours to answer
            os._exit(0)
        return Result(
            rc=rc,
            exc=exc_info,
            dur=duration,
            dropped=[self.out_raw.dropped, self.err_raw.dropped],
            fatal=self._flush(),
        )

    def _compile(self, code: str) -> types.CodeType:
        """Compile as a module (cached: RL rollouts resend the same snippets)."""
        cached = self._compiled.pop(code, None)
        if cached is None:
            self.calls += 1
            filename = f"<cell-{self.calls}>"
            linecache.cache[filename] = (len(code), None, code.splitlines(True), filename)
            cached = compile(code, filename, "exec")
            while len(self._compiled) >= COMPILE_CACHE:
                self._compiled.pop(next(iter(self._compiled)))
        self._compiled[code] = cached  # most recently used last
        return cached

    def _exit_code(self, exc: SystemExit) -> int:
        code = exc.code
        if code is None:
            return 0
        if isinstance(code, int):
            return code & 0xFF
        self.err.write(f"{_safe_str(code)}\n")
        return 1

    def _print_traceback(self, exc: BaseException) -> None:
        tb = exc.__traceback__
        # drop our own frame: the traceback starts at the user's code
        if tb is not None and tb.tb_frame.f_code is _Worker.run.__code__:
            tb = tb.tb_next
        try:
            text = _format_traceback(exc, tb)
        except BaseException as fmt_exc:  # a hostile __str__ or __repr__
            text = f"{_type_name(exc)}: <traceback unavailable: {_type_name(fmt_exc)}>\n"
        try:
            self.err.write(text)
        except (OSError, ValueError):  # the code closed our stderr stream: reported below
            return

    def _flush(self) -> str | None:
        for stream in (self.out, self.err):
            try:
                stream.flush()
            except (OSError, ValueError) as exc:
                return f"flushing output failed: {exc!r}"
        return None

    # --- fork_session ---------------------------------------------------------------

    def fork(self, frame: Frame) -> None:
        """Copy this interpreter into ``len(frame.fds)`` new sessions.

        A double fork hands each copy to the fork server (we clear our
        subreaper flag meanwhile), so the copies outlive this session and are
        killed and reaped by the server like any session.
        """
        request = Fork.decode(frame)
        workdirs, source_dir = request.workdirs, request.source
        chans = list(frame.fds)
        if own_pids():  # copies would stay in (and die with) this session's PID namespace
            for fd in chans:
                os.close(fd)
            reason = "fork_session copies no interpreter memory with SandboxConfig(own_pids=True)"
            send_message(self.chan, Error(reason), frame.seq)
            return
        source = self.pid
        server = os.getppid()  # the fork server: the copies' parent once the middle is gone
        set_subreaper(False)
        middles: list[int] = []
        failed = ""
        try:
            try:
                for index, (fd, workdir) in enumerate(zip(chans, workdirs, strict=True)):
                    try:
                        middle = os.fork()
                    except OSError as exc:  # e.g. the session's process budget is used up
                        failed = f"the session could not fork (after {index} copies): {exc}"
                        break
                    if middle == 0:
                        # the copy learns that the middle process is gone (and that it now
                        # belongs to the fork server) when this pipe reaches EOF
                        gone_r, gone_w = os.pipe()
                        try:
                            copy = os.fork()
                        except OSError as exc:  # tell the parent on the copy's channel
                            error = Error(f"the session could not fork: {exc}")
                            send_message(socket.socket(fileno=fd), error, 0)
                            os._exit(0)
                        if copy == 0:
                            os.close(gone_w)
                            os.read(gone_r, 1)
                            os.close(gone_r)
                            _adopted_by(server)  # before HELLO: a KILL must find us
                            for other in chans[:index] + chans[index + 1 :]:
                                os.close(other)
                            self._become_copy(fd, workdir, source_dir)
                            return  # the copy continues the serve loop on its own channel
                        os._exit(0)
                    middles.append(middle)
                    # reaped at once: its zombie would take a place in the process budget
                    os.waitpid(middle, 0)
                    middles.pop()
            finally:
                if os.getpid() == source:  # not in a copy, which returns from inside the loop
                    for fd in chans:
                        os.close(fd)
            if failed:  # the source itself is fine: say so, the parent drops the copies
                send_message(self.chan, Error(failed), frame.seq)
            else:
                send_message(self.chan, Forked(len(chans)), frame.seq)
        finally:
            if os.getpid() == source:
                for middle in middles:  # all copies are the server's once these are gone
                    os.waitpid(middle, 0)
                set_subreaper(True)

    def _become_copy(self, fd: int, workdir: str, source_dir: str | None) -> None:
        self.chan.close()
        self.chan = socket.socket(fileno=fd)
        os.setsid()
        set_subreaper(True)
        self.pid = os.getpid()
        os.makedirs(workdir, 0o700, exist_ok=True)  # the server's is hidden under a disk_quota
        if source_dir:
            # under the session's own layers: it can only copy what it could read anyway
            try:
                copy_tree(source_dir, workdir)
            except OSError as exc:
                error = Error(f"copying the working directory failed: {exc}")
                send_message(self.chan, error, 0)
                os._exit(EXIT_BROKEN)
        try:  # writes only in its own directory from here on
            enter_copy(workdir)
        except (OSError, RuntimeError) as exc:
            send_message(self.chan, Error(f"confining the copy failed: {exc}"), 0)
            os._exit(EXIT_BROKEN)
        os.chdir(workdir)
        os.environ["HOME"] = os.environ["TMPDIR"] = os.environ["PWD"] = workdir
        os.close(self.out_fd)
        os.close(self.err_fd)
        self._new_outputs()
        self.hello(namespaces=False)  # its namespaces are the source's

    # --- loop -------------------------------------------------------------------

    def _await_request(self, replied: float) -> None:
        """Poll for the next request for up to ``busy_poll`` seconds, then let recv sleep.

        Adaptive: only while calls come back to back (the previous one arrived
        within the window), so an interpreter waiting seconds between turns of
        a rollout spends one window of CPU, not one per call.
        """
        if self._hot:
            end = replied + self.busy_poll
            while _perf_counter() < end:
                try:
                    self.chan.recv(1, _PEEK)
                except BlockingIOError:
                    _yield()  # let a process that has work run first
                    continue
                except OSError:  # broken channel: the blocking recv reports it
                    pass
                return

    def _after_reply(self) -> None:
        hook = self.globals.pop(AFTER_REPLY, None)
        if hook is None:
            return
        try:
            hook()
        except BaseException:  # the session's own machinery failed: end it (see AFTER_REPLY)
            os._exit(EXIT_BROKEN)

    def serve(self) -> NoReturn:
        self.hello()
        replied = 0.0
        while True:
            self._await_request(replied)
            try:
                frame = recv_frame(self.chan, max_body=MAX_REQUEST)
            except (OSError, ValueError):  # parent gone or channel broken by user code
                os._exit(EXIT_BROKEN)
            if self.busy_poll:
                self._hot = _perf_counter() - replied <= self.busy_poll
            if frame.kind == Kind.EXEC:
                result = self.run(Exec.decode(frame).code)
                try:
                    send_message(self.chan, result, frame.seq)
                except (OSError, TypeError, ValueError):  # channel or json broken by the code
                    os._exit(EXIT_BROKEN)
                replied = _perf_counter()
                if result.fatal is not None:
                    os._exit(EXIT_BROKEN)
                self._after_reply()
            elif frame.kind == Kind.FORK:
                self.fork(frame)
            else:
                os._exit(EXIT_BROKEN)


def copy_tree(source: str, target: str) -> None:
    """Copy a session's working directory into a copy's (existing, empty) one.

    Regular files (with their permission bits), directories and symlinks (as
    links, never followed); sockets, FIFOs and devices are skipped, and so is
    what the code made unreadable to itself. Other errors (a full disk) raise.
    Iterative, so a deep tree cannot exhaust the stack.
    """
    pending = [(source, target)]
    modes: list[tuple[str, int]] = []  # directories get theirs last: 0o500 would stop the copy
    while pending:
        src_dir, dst_dir = pending.pop()
        try:
            entries = list(os.scandir(src_dir))
        except PermissionError:
            continue
        for entry in entries:
            dst = os.path.join(dst_dir, entry.name)
            try:
                if entry.is_symlink():
                    os.symlink(os.readlink(entry.path), dst)
                elif entry.is_dir(follow_symlinks=False):
                    os.mkdir(dst, 0o700)
                    pending.append((entry.path, dst))
                    modes.append((dst, entry.stat(follow_symlinks=False).st_mode & 0o777))
                elif entry.is_file(follow_symlinks=False):
                    shutil.copyfile(entry.path, dst, follow_symlinks=False)
                    os.chmod(dst, entry.stat(follow_symlinks=False).st_mode & 0o777)
            except PermissionError:
                continue
    for path, mode in reversed(modes):
        os.chmod(path, mode)


def _adopted_by(server: int) -> None:
    """Wait (microseconds) until we are the server's child, then die with it.

    The pipe reaches EOF while the middle process is still exiting, before we
    are re-parented; a death signal set then would fire at once.
    """
    deadline = time.monotonic() + 5.0
    while os.getppid() != server:
        if time.monotonic() > deadline:  # the server itself is gone
            os._exit(0)
        os.sched_yield()
    die_with_parent()
    if os.getppid() != server:  # it died between the check and the prctl
        os._exit(0)


def _format_traceback(exc: BaseException, tb: types.TracebackType | None) -> str:
    """The traceback text; a deep one (a runaway recursion) shows only its innermost frames.

    Only those frames are handed to ``traceback``: it looks up the source
    position of every frame it is given, even with a negative ``limit``
    (about 1.5 us a frame, 1.5 s for a million).
    """
    depth, tail, walk = 0, tb, tb
    while walk is not None:
        depth, walk = depth + 1, walk.tb_next
        if depth > TRACEBACK_TAIL and tail is not None:
            tail = tail.tb_next  # stays TRACEBACK_TAIL frames behind the end
    if depth <= TRACEBACK_FULL:
        return "".join(traceback.format_exception(type(exc), exc, tb))
    lines = traceback.format_exception(type(exc), exc, tail)
    note = f"  [... {depth - TRACEBACK_TAIL} earlier frames not shown ...]\n"
    for index, line in enumerate(lines):
        if line.startswith("Traceback (most recent call last):"):
            lines.insert(index + 1, note)
            break
    return "".join(lines)


def _type_name(obj: object) -> str:
    cls = type(obj)
    module = cls.__module__
    return (
        cls.__qualname__ if module in ("builtins", "__main__") else f"{module}.{cls.__qualname__}"
    )


def _safe_str(obj: object) -> str:
    try:
        text = str(obj)
    except BaseException:  # hostile __str__: never let it break the worker
        return f"<{_type_name(obj)} with unprintable message>"
    return text if len(text) <= MAX_EXC_MESSAGE else text[:MAX_EXC_MESSAGE] + "..."


def serve_session(chan: socket.socket, *, max_output: int, busy_poll: float = 0.0) -> NoReturn:
    """Entry point in a freshly forked session child (never returns)."""
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a full output file gives EFBIG, not death
    signal.signal(signal.SIGINT, signal.default_int_handler)
    set_subreaper(True)
    cap_recursion_limit(recursion_cap())
    cap_thread_stacks()
    faulthandler.enable()  # a crash still tells where: a Python traceback on stderr (fd 2)
    try:
        _Worker(chan, max_output, busy_poll).serve()
    except BaseException:  # the worker itself broke: exit, the parent reports and restarts
        os._exit(EXIT_BROKEN)
