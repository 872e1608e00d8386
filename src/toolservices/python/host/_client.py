"""The parent's side: starting the fork server and talking to sessions.

Host side; everything here runs on one event loop (the service's), except
``SessionHandle.run_blocking`` (the direct route). A :class:`ForkServerClient`
owns the fork-server process and its control channel; a
:class:`SessionHandle` is one live interpreter: its channel (which draws each
request's random sequence number) and the two memfds holding its output.
Messages are the typed ones of ``runtime/_protocol.py``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import functools
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path
from types import ModuleType
from typing import Any

import anyio

from toolservices import _portal
from toolservices._clip import capped_text
from toolservices.errors import InfrastructureError
from toolservices.python import runtime
from toolservices.python.host._channel import Channel, check_reply, out_of_descriptors
from toolservices.python.host._result import ExceptionInfo, ExecResult
from toolservices.python.runtime import (
    EXIT_BROKEN,
    Config,
    Discard,
    Error,
    Exec,
    Frame,
    Hello,
    Kill,
    Kind,
    Message,
    Ok,
    PeerClosed,
    ProtocolViolation,
    Ready,
    Result,
    Spawn,
    remove_tree,
)
from toolservices.python.sandbox import fast_tmp_dir

__all__ = ["ForkServerClient", "SessionHandle", "SessionLost"]

#: the fork server imports the preloaded modules before READY: numpy or sympy take a while
SERVER_START_TIMEOUT = 60.0
#: a forked session answers HELLO in milliseconds; this only guards against a wedged server
SESSION_START_TIMEOUT = 10.0
#: a session seeded with a copy of another's files says HELLO once the copy is made: a
#: 1 GiB workspace copies in about a second
SEED_START_TIMEOUT = 120.0
#: a KILL sweeps with SIGKILL and reaps; only a process stuck in the kernel could take longer
KILL_TIMEOUT = 10.0
#: after closing the control socket the server sweeps and exits; then SIGTERM, then SIGKILL
SERVER_EXIT_GRACE = 2.0
MAX_META = 1 << 20
_SRC_ROOT = str(Path(__file__).resolve().parents[3])
_SERVER_SCRIPT = runtime.script("_forkserver")


class SessionLost(Exception):
    """The session cannot serve the call (it was found broken before running it)."""


class _Broken(ProtocolViolation):
    """The worker reported that the code broke its machinery (it exits next)."""


def _problem(exc: ProtocolViolation) -> str:
    """How a failed call is described: a dead peer by its exit status, the rest by name."""
    if isinstance(exc, PeerClosed):
        return ""
    if isinstance(exc, _Broken):
        return str(exc)
    return f"protocol violation: {exc}"


def _read_capture(fd: int, cap: int, dropped: int) -> tuple[str, bool]:
    """Read one memfd: at most ``cap`` bytes, with a visible marker past it."""
    size = os.fstat(fd).st_size
    data = os.pread(fd, min(size, cap), 0) if size else b""
    return capped_text(data, max(0, size - cap) + dropped)


#: what a SIGSEGV in a session almost always is: the recursion cap keeps common C recursion
#: within the stack, not C code with large frames (sandbox.md, "Deep recursion")
_SEGV_CAUSE = (
    " (a segmentation fault, most often the C stack overflowing: recursion through C code"
    " with large frames, such as select() from fileno() or sorted() from a key function in"
    " a thread, deeper than the stack holds)"
)


#: what a SIGKILL nobody on this side sent most likely is when sessions have memory cgroups
_OOM_CAUSE = (
    " (most likely the kernel's: the session's memory, shared memory and in-memory files"
    " included, went over its memory limit)"
)


def _describe_status(code: int | None, *, memory_cgroup: bool = False) -> str:
    if code is None:
        return "ended"
    if code == EXIT_BROKEN:
        return f"exited with status {code}: the code broke its channel or output files"
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        if -code == signal.SIGSEGV:
            return f"was killed by {name}{_SEGV_CAUSE}"
        if -code == signal.SIGKILL and memory_cgroup:
            return f"was killed by {name}{_OOM_CAUSE}"
        return f"was killed by {name}"
    return f"exited with status {code}"


class ForkServerClient:
    """Starts the fork server and sends it requests, one at a time."""

    def __init__(
        self,
        *,
        layers: ModuleType,
        sandbox: Any,
        preload: tuple[str, ...],
        max_output: int,
        busy_poll: float = 0.0,
        python: str | None = None,
        preload_code: str = "",
    ) -> None:
        self.layers = layers
        self.sandbox = sandbox
        self.preload = preload
        self.preload_code = preload_code
        self.max_output = max_output
        self.busy_poll = busy_poll
        self.python = python or sys.executable
        self.lock = anyio.Lock()
        self.proc: subprocess.Popen[bytes] | None = None
        self.chan: Channel | None = None
        self._own_base = ""
        self.plan: Any = None
        self.report: dict[str, Any] = {}
        self.info: dict[str, Any] = {}
        self._errlog: Any = None
        self.pidfd = -1
        self.stopping = False  # set when we end it ourselves (its exit is then expected)
        self.handles: set[SessionHandle] = set()  # live ones: released if we are dropped

    @property
    def alive(self) -> bool:
        return self.chan is not None and not self.chan.closed

    async def start(self) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        # the plan may own the workdir base (a mount inside bubblewrap): it names it
        placeholder = getattr(self.layers, "WORKDIR_BASE_PLACEHOLDER", None)
        if placeholder is None:
            self._own_base = tempfile.mkdtemp(prefix="toolservices-py-", dir=fast_tmp_dir())
        # by path with -s: the server loads only the stdlib and the runtime package
        argv = ["-s", _SERVER_SCRIPT, "--fd", str(theirs.fileno())]
        argv += ["--base", placeholder or self._own_base]
        try:
            # kept referenced until the server is reaped: closing it sweeps the sandbox uid
            # planning may probe launches (bwrap, seccomp): off the event loop
            self.plan = await anyio.to_thread.run_sync(
                functools.partial(
                    self.layers.plan_server_launch, self.sandbox, python=self.python, argv=argv
                )
            )
            plan = self.plan
            self.report = dict(plan.report)
            self._errlog = tempfile.TemporaryFile()  # noqa: SIM115 - open while the server lives
            # started from the event-loop thread, which lives as long as the service
            # (bubblewrap's --die-with-parent follows the starting thread)
            self.proc = subprocess.Popen(  # noqa: ASYNC220 - fork+exec, returns in milliseconds
                plan.argv,
                env=plan.env,
                pass_fds=(theirs.fileno(),),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=self._errlog,
                cwd=_SRC_ROOT,
                start_new_session=True,
            )
        except BaseException:
            ours.close()
            await self.stop()
            raise
        finally:
            theirs.close()
        self.chan = Channel(ours, max_body=MAX_META)
        # the server takes the workdir base from its argv
        config = Config(
            max_output=self.max_output,
            busy_poll=self.busy_poll,
            preload=list(self.preload),
            preload_code=self.preload_code,
        )
        try:
            with anyio.fail_after(SERVER_START_TIMEOUT):
                frame = await self.chan.request(config, expect=(Kind.READY,), timeout=None)
            self.info = dataclasses.asdict(Ready.decode(frame))
            assert self.proc is not None
            self.pidfd = os.pidfd_open(self.proc.pid)
        except (ProtocolViolation, TimeoutError) as exc:
            tail = self.stderr_tail()
            await self.stop()
            raise InfrastructureError(
                f"the Python fork server did not start: {exc}; its stderr: {tail!r}",
                retryable=False,
            ) from None
        except BaseException:  # cancelled while it starts: nobody will own it, stop it now
            await self.stop()  # shielded
            raise

    async def wait_exit(self) -> None:
        """Return when the server process has exited (its pidfd turns readable)."""
        if self.pidfd >= 0:
            await anyio.wait_readable(self.pidfd)

    def stderr_tail(self, limit: int = 2000) -> str:
        if self._errlog is None:
            return ""
        self._errlog.seek(0, os.SEEK_END)
        size = self._errlog.tell()
        self._errlog.seek(max(0, size - limit))
        tail: bytes = self._errlog.read()
        return tail.decode("utf-8", "replace")

    def close_errlog(self) -> None:
        if self._errlog is not None:
            self._errlog.close()
            self._errlog = None

    def release_files(self) -> None:
        """Close what this client holds open besides the control channel."""
        self.close_errlog()
        if self.pidfd >= 0:
            os.close(self.pidfd)
            self.pidfd = -1

    @contextlib.asynccontextmanager
    async def exclusive(self) -> AsyncIterator[None]:
        """Hold the control channel across several requests (``fork_session``)."""
        async with self.lock:
            yield

    async def request_locked(self, message: Message, fds: tuple[int, ...] = ()) -> Ok:
        """One request to the server (the caller holds :attr:`lock`); its OK reply.

        An ERROR reply raises a retryable :class:`InfrastructureError`; anything
        else (a wrong frame, no reply within ``KILL_TIMEOUT``) also closes the
        channel: the server is lost.
        """
        chan = self.chan
        if chan is None or chan.closed:
            raise InfrastructureError("the Python fork server is not running", retryable=True)
        try:
            frame = await chan.request(
                message, expect=(Kind.OK, Kind.ERROR), timeout=KILL_TIMEOUT, fds=fds
            )
            if frame.kind == Kind.ERROR:
                error = Error.decode(frame).error
                raise InfrastructureError(f"fork server: {error}", retryable=True)
            reply = Ok.decode(frame)
        except (ProtocolViolation, TimeoutError) as exc:
            chan.close()
            raise InfrastructureError(
                f"lost the Python fork server: {exc}; its stderr: {self.stderr_tail()!r}",
                retryable=True,
            ) from None
        return reply

    async def request(self, message: Message, fds: tuple[int, ...] = ()) -> Ok:
        async with self.lock:
            return await self.request_locked(message, fds)

    async def spawn(
        self, *, seed: SessionHandle | None = None, root: dict[str, Any] | None = None
    ) -> SessionHandle:
        """A new session; with ``seed`` (a live session) holding a copy of its files; with
        ``root`` on that image instead of the launch's (see ``Spawn``)."""
        ours, workdir = await self.start_spawn(seed=seed, root=root)
        limit = SESSION_START_TIMEOUT if seed is None else SEED_START_TIMEOUT
        return await SessionHandle.connect(self, ours, workdir, start_timeout=limit)

    async def start_spawn(
        self, *, seed: SessionHandle | None = None, root: dict[str, Any] | None = None
    ) -> tuple[socket.socket, str]:
        """The SPAWN request alone: the new session's channel and workdir (it says HELLO
        there once started; :meth:`SessionHandle.connect` waits for that)."""
        try:
            ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        except OSError as exc:
            if exc.errno not in (errno.EMFILE, errno.ENFILE):
                raise
            raise out_of_descriptors(str(exc.strerror)) from exc
        source = None if seed is None else seed.workdir
        fds = (theirs.fileno(), *(() if seed is None else seed.ns_fds))
        try:
            reply = await self.request(Spawn(seed=source, root=root), fds)
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
        if reply.workdir is None:
            ours.close()
            raise InfrastructureError("fork server: SPAWN reply without a workdir", retryable=True)
        return ours, reply.workdir

    async def kill(self, workdir: str) -> int | None:
        """Kill a session's tree, reap it, delete its directory; its exit status."""
        with anyio.CancelScope(shield=True):
            reply = await self.request(Kill(workdir))
        return reply.status if isinstance(reply.status, int) else None

    async def discard(self, workdir: str) -> None:
        """Kill a session's tree without waiting for it to be reaped."""
        with anyio.CancelScope(shield=True):
            await self.request(Discard(workdir))

    async def stop(self) -> None:
        """Close the control channel (the server sweeps and exits), then escalate."""
        self.stopping = True
        with anyio.CancelScope(shield=True):
            if self.chan is not None:
                self.chan.close()
            proc = self.proc
            if proc is not None:
                for sig in (None, signal.SIGTERM, signal.SIGKILL):
                    if sig is not None:
                        with contextlib.suppress(ProcessLookupError):
                            proc.send_signal(sig)
                    try:
                        await anyio.to_thread.run_sync(proc.wait, SERVER_EXIT_GRACE)
                        break
                    except subprocess.TimeoutExpired:
                        continue
            self.release_files()
            plan, self.plan = self.plan, None
            if plan is not None and hasattr(plan, "close"):
                await anyio.to_thread.run_sync(plan.close)
            if self._own_base:
                remove_tree(self._own_base)  # on tmpfs: microseconds
                self._own_base = ""


class SessionHandle:
    """One live interpreter."""

    def __init__(self, server: ForkServerClient, chan: Channel, workdir: str) -> None:
        self.server = server
        self.chan = chan
        self.workdir = workdir
        self.pid = 0
        self.out_fd = -1
        self.err_fd = -1
        self.dead = False
        self.calls = 0
        self.ns_fds: tuple[int, ...] = ()
        server.handles.add(self)

    @classmethod
    async def connect(
        cls,
        server: ForkServerClient,
        sock: socket.socket,
        workdir: str,
        *,
        start_timeout: float = SESSION_START_TIMEOUT,
    ) -> SessionHandle:
        """Wait for the worker's HELLO (its pid and its two output memfds)."""
        handle = cls(server, Channel(sock, max_body=MAX_META), workdir)
        try:
            with anyio.fail_after(start_timeout):
                frame = await handle.chan.recv()
            handle._accept_hello(frame)
        except BaseException as exc:
            await handle.kill()
            if isinstance(exc, (ProtocolViolation, TimeoutError)):
                python = getattr(server.sandbox, "root_python", "")
                hint = (
                    f" (the image's {python} ended before serving it: the session runs "
                    "the image's own Python, which must be CPython 3.10 or newer)"
                    if python
                    else ""
                )
                raise InfrastructureError(
                    f"a Python session failed to start: {exc}{hint}", retryable=True
                ) from None
            raise
        return handle

    def _accept_hello(self, frame: Frame) -> None:
        fds = frame.fds
        if frame.kind == Kind.ERROR:
            raise ProtocolViolation(f"session set-up failed: {Error.decode(frame).error}")
        if frame.kind != Kind.HELLO or len(fds) not in (2, 4):
            for fd in fds:
                os.close(fd)
            raise ProtocolViolation(
                f"expected HELLO with 2 or 4 descriptors, got kind {frame.kind} with {len(fds)}"
            )
        self.out_fd, self.err_fd = fds[:2]
        self.ns_fds = tuple(fds[2:])  # its user and mount namespaces: seeds copies (_seed)
        self.pid = int(Hello.decode(frame).pid)

    async def kill(self, *, wait: bool = True) -> int | None:
        """Kill this interpreter's whole process tree and release everything.

        With ``wait=False`` the server answers once the tree is signalled and
        reaps it in the background (no exit status).
        """
        if self.dead:
            return None
        self.dead = True
        self.server.handles.discard(self)
        self.chan.close()
        status = None
        try:
            if self.server.alive and wait:
                status = await self.server.kill(self.workdir)
            elif self.server.alive:
                await self.server.discard(self.workdir)
        except InfrastructureError:  # the server died: its sessions died with it
            status = None
        finally:
            self._close_fds()
        return status

    def abandon(self) -> None:
        """Forget an interpreter whose fork server is gone (nothing left to ask)."""
        self.dead = True
        self.server.handles.discard(self)
        self.chan.close()
        self._close_fds()

    def _close_fds(self) -> None:
        for fd in (self.out_fd, self.err_fd, *self.ns_fds):
            if fd >= 0:
                os.close(fd)
        self.out_fd = self.err_fd = -1
        self.ns_fds = ()

    def _begin(self, code: str) -> tuple[int, bytes]:
        """The next sequence number and the request body; refuses a broken session."""
        if self.dead or self.chan.has_stray_data():
            raise SessionLost("the interpreter sent unsolicited data or is gone")
        self.calls += 1
        return self.chan.next_seq(), Exec(code).body()

    def _reply(self, frame: Frame, seq: int, start: float, session_id: str | None) -> ExecResult:
        """The result carried by ``frame``; :class:`ProtocolViolation` if it is not one."""
        check_reply(frame, seq, (Kind.RESULT,))
        if frame.fds:
            for fd in frame.fds:
                os.close(fd)
            raise ProtocolViolation("a result frame came with descriptors")
        result = Result.decode(frame)
        if result.fatal is not None:
            raise _Broken(str(result.fatal))
        return self._completed(result, time.perf_counter() - start, session_id)

    async def run(
        self,
        code: str,
        *,
        limit: float,
        fresh: bool,
        session_id: str | None = None,
        spin: float = 0.0,
    ) -> ExecResult:
        """Run one snippet; on timeout, crash or protocol violation the tree is killed.

        ``spin``: seconds to poll for the reply before sleeping (see ``_channel``).
        """
        seq, payload = self._begin(code)
        start = time.perf_counter()
        try:
            # a quick reply needs no cancel scope: no await comes before it
            outgoing = self.chan.start_send(Exec.KIND, seq, payload)
            frame = None if outgoing[0] else self.chan.poll(min(spin, limit))
            if frame is None:
                with anyio.move_on_after(limit - (time.perf_counter() - start)):
                    await self.chan.finish_send(outgoing)
                    frame = await self.chan.recv()
            if frame is None:
                return await self._killed(start, limit=limit, fresh=fresh, session_id=session_id)
            return self._reply(frame, seq, start, session_id)
        except ProtocolViolation as exc:
            problem = _problem(exc)
        except BaseException:
            # cancelled by the caller mid-call: the interpreter is in an unknown state
            with anyio.CancelScope(shield=True):
                await self.kill()
            raise
        return await self._killed(start, problem=problem, fresh=fresh, session_id=session_id)

    def run_blocking(
        self, code: str, *, limit: float, session_id: str | None = None, spin: float = 0.0
    ) -> ExecResult:
        """:meth:`run` for a session, waiting in the calling thread (not the loop's).

        Only the rare endings (timeout, crash, violation, the caller interrupted)
        go through the loop, which owns the fork server that kills the tree.
        """
        seq, payload = self._begin(code)
        start = time.perf_counter()
        deadline = time.monotonic() + limit
        try:
            frame = None
            if self.chan.send_blocking(Exec.KIND, seq, payload, deadline=deadline):
                frame = self.chan.recv_blocking(deadline=deadline, spin=spin)
            if frame is not None:
                return self._reply(frame, seq, start, session_id)
            killed = functools.partial(self._killed, start, limit=limit, fresh=False)
        except ProtocolViolation as exc:
            killed = functools.partial(self._killed, start, problem=_problem(exc), fresh=False)
        except BaseException:  # Ctrl-C in the caller: the interpreter is in an unknown state
            _portal.run_sync(self.kill)
            raise
        return _portal.run_sync(functools.partial(killed, session_id=session_id))

    def _completed(self, result: Result, duration: float, session_id: str | None) -> ExecResult:
        try:
            rc = int(result.rc)
            dropped_out, dropped_err = (int(x) for x in result.dropped)
            exc = result.exc
            exception = (
                ExceptionInfo(type=str(exc["type"]), message=str(exc["message"])) if exc else None
            )
        except (KeyError, TypeError, ValueError) as err:
            raise ProtocolViolation(f"malformed result: {err!r}") from None
        stdout, cut_out = _read_capture(self.out_fd, self.server.max_output, dropped_out)
        stderr, cut_err = _read_capture(self.err_fd, self.server.max_output, dropped_err)
        return ExecResult(
            success=rc == 0,
            stdout=stdout,
            stderr=stderr,
            returncode=rc,
            exception=exception,
            duration=duration,
            truncated=cut_out or cut_err,
            session_id=session_id,
        )

    async def _killed(
        self,
        start: float,
        *,
        limit: float | None = None,
        problem: str = "",
        fresh: bool,
        session_id: str | None = None,
    ) -> ExecResult:
        """The call did not complete normally: kill the tree, keep its partial output."""
        with anyio.CancelScope(shield=True):
            out_fd, err_fd = os.dup(self.out_fd), os.dup(self.err_fd)
            try:
                status = await self.kill()
                stdout, cut_out = _read_capture(out_fd, self.server.max_output, 0)
                stderr, cut_err = _read_capture(err_fd, self.server.max_output, 0)
            finally:
                os.close(out_fd)
                os.close(err_fd)
        lost = (
            "" if fresh else " The interpreter was restarted: variables defined earlier are lost."
        )
        if limit is not None:
            exception = ExceptionInfo(
                type="TimeoutError", message=f"execution exceeded the {limit:g} s time limit"
            )
            note = f"TimeoutError: execution exceeded the {limit:g} s time limit and was killed."
            rc = -1
        else:
            layers = self.server.report.get("layers", {})
            memcg = bool(layers.get("memory_cgroup", {}).get("active"))
            what = problem or f"the interpreter {_describe_status(status, memory_cgroup=memcg)}"
            exception = ExceptionInfo(type="InterpreterExit", message=what)
            note = f"InterpreterExit: {what}."
            rc = status if status is not None else -1
        if stderr and not stderr.endswith("\n"):
            stderr += "\n"
        return ExecResult(
            # os._exit(0) is a clean exit, not a failure; anything else is
            success=limit is None and not problem and status == 0,
            stdout=stdout,
            stderr=stderr + note + lost + "\n",
            returncode=rc,
            exception=exception,
            duration=time.perf_counter() - start,
            timed_out=limit is not None,
            truncated=cut_out or cut_err,
            restarted=not fresh,
            session_id=session_id,
        )
