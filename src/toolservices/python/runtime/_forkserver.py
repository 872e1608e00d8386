"""The fork server: a lean interpreter that forks sessions on request.

Run as ``python -s <package dir>/python/runtime/_forkserver.py --fd N --base DIR``
by the parent (by path, so that only the standard library and the
runtime package are loaded, not ``toolservices``), never forked from it (the
trainer may have imported torch; forking it is slower than a cold start). It
imports the configured modules (and runs the configured ``preload_code``) once, then
answers framed requests on its control socket one at a time:

* ``SPAWN`` (with the session's channel end attached): make a private working
  directory and fork a session worker into it (with ``seed``: a new session
  whose directory starts as a copy of that live session's files, see
  ``_seed``);
* ``KILL``: kill a session's whole process tree, reap it, delete its directory,
  report its exit status; ``DISCARD``: the same without waiting (cleanup
  happens when the kernel reports the death);
* ``MKDIRS`` / ``ADOPT`` / ``RELEASE``: working directories for, and
  registration of, sessions copied by ``fork_session``.

The server is a child subreaper, so the orphans of every dead session end up
as its children; a kill sweeps every descendant that is not a live registered
session, repeatedly, until none is left. When the control socket closes (the
parent exited or died) it kills everything and removes the base directory.
"""

from __future__ import annotations

if __name__ == "__main__" and not __package__:  # started by path (the only way it runs)
    import sys  # (-I leaves the script's directory off sys.path)

    sys.path.insert(0, __file__.rpartition("/")[0])
    import _bootstrap  # noqa: F401

import argparse
import gc
import importlib
import json
import os
import selectors
import signal
import socket
import sys
import traceback
from typing import Any

from ._confine import _load_state, fork_confined, remove_tree
from ._imagepy import exec_image_python, root_python, runtime_zip
from ._linux import set_subreaper
from ._memcg import MemoryGroups, join
from ._protocol import (
    Adopt,
    Config,
    Discard,
    Error,
    Frame,
    Kill,
    Kind,
    Message,
    Mkdirs,
    Ok,
    PeerClosed,
    Ready,
    Release,
    Spawn,
    recv_frame,
    send_message,
)
from ._rootfs import check_root, preload_image_modules
from ._worker import serve_session, set_default_thread_stack

__all__ = ["children_of", "main"]

MAX_CONTROL = 1 << 24


def children_of(pid: int) -> list[int]:
    """Direct children of ``pid`` (all threads), from /proc."""
    kids: list[int] = []
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return kids
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/children") as fh:
                kids.extend(int(x) for x in fh.read().split())
        except (OSError, ValueError):
            continue
    return kids


def _new_dir(parent: str, prefix: str) -> str:
    """A new directory with a random name (mode 0700), like ``tempfile.mkdtemp``.

    Not ``tempfile`` itself: it imports ``random``, whose after-fork hook
    reseeds its generator in every session, a page or more each that the
    sessions would otherwise share with this server.
    """
    while True:
        path = os.path.join(parent, prefix + os.urandom(6).hex())
        try:
            os.mkdir(path, 0o700)
        except FileExistsError:
            continue
        return path


def _remove(path: str) -> None:
    """:func:`remove_tree`, or coreutils when it cannot (odd modes, more levels than fds)."""
    try:
        remove_tree(path)
    except OSError:
        # not subprocess: it imports threading, whose after-fork hook every session pays
        rm = _which("rm")
        if rm is None:
            return
        null = os.open(os.devnull, os.O_RDWR | os.O_CLOEXEC)
        try:
            pid = os.posix_spawn(
                rm,
                [rm, "-rf", "--one-file-system", "--", path],
                os.environ,
                file_actions=[(os.POSIX_SPAWN_DUP2, null, fd) for fd in (0, 1, 2)],
            )
        finally:
            os.close(null)
        os.waitpid(pid, 0)


def _which(name: str) -> str | None:
    """``name`` on the PATH (``shutil`` is not imported here for one lookup)."""
    for folder in os.environ.get("PATH", "/usr/bin:/bin").split(os.pathsep):
        candidate = os.path.join(folder, name)
        if os.access(candidate, os.X_OK):
            return candidate
    return None


class ForkServer:
    def __init__(self, ctrl: socket.socket, config: Config, *, base: str) -> None:
        self.ctrl = ctrl
        self.base = base
        self.max_output = config.max_output
        self.busy_poll = config.busy_poll
        self.sessions: dict[str, int] = {}  # live session: workdir -> pid
        # A fresh session gets a "lineage" directory and works in <lineage>/w0; the
        # isolation layers grant writes beneath the lineage, so the copies made by
        # fork_session (which inherit those layers) can work in <lineage>/w<id>.
        self.lineages: dict[str, set[str]] = {}
        # sessions killed by DISCARD, not yet reaped: pid -> workdir (cleaned up at reaping)
        self.discarding: dict[int, str] = {}
        # between MKDIRS and ADOPT/RELEASE, copies made by fork_session are our children
        # but not yet registered: no background sweep may run then (it would kill them)
        self.forking = 0
        self.sweep_pending = False
        self.status: dict[str, int] = {}  # exit status of sessions reaped before their KILL
        self.pid = os.getpid()
        self.wake_r, self.wake_w = socket.socketpair()
        self.wake_r.setblocking(False)
        self.wake_w.setblocking(False)
        self.selector = selectors.DefaultSelector()
        #: one memory cgroup per lineage (a session and its fork_session copies) when the
        #: launch plan delegated a group to us; removed with the lineage's directory
        self.memcg = MemoryGroups.from_environ()
        #: sessions on an image's own Python exec it with the runtime from this zip
        self.image_python = root_python(_load_state())
        #: sessions on another image than the launch state's (SPAWN's ``root``): workdir -> it
        self.roots: dict[str, dict[str, Any]] = {}
        self.runtime_zip = runtime_zip() if self.image_python else -1

    # --- process bookkeeping -------------------------------------------------------------

    def _record(self, pid: int, status: int) -> None:
        code = os.waitstatus_to_exitcode(status)
        for workdir, live in list(self.sessions.items()):
            if live == pid:
                del self.sessions[workdir]
                self.status[workdir] = code

    def reap(self) -> None:
        """Collect every child that has exited (sessions and stray orphans)."""
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            self._record(pid, status)
            workdir = self.discarding.pop(pid, None)
            if workdir is not None:  # its orphans are ours now: sweep them, then its directory
                self._release_dir(workdir)
                self.sweep_pending = True
        if self.sweep_pending and not self.forking:
            self.sweep_pending = False
            self.sweep()

    def sweep(self) -> dict[int, int]:
        """Kill and reap every descendant that is not a live session; statuses by pid."""
        statuses: dict[int, int] = {}
        keep = set(self.sessions.values())
        while True:
            targets: list[int] = []
            direct = set(children_of(self.pid)) - keep
            frontier = list(direct)
            while frontier:
                pid = frontier.pop()
                targets.append(pid)
                frontier.extend(p for p in children_of(pid) if p not in keep)
            if not targets:
                return statuses
            for pid in targets:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    continue
            for pid in direct:
                try:
                    _, status = os.waitpid(pid, 0)
                except ChildProcessError:
                    continue
                statuses[pid] = os.waitstatus_to_exitcode(status)

    # --- requests ---------------------------------------------------------------------

    def spawn(self, frame: Frame) -> Ok:
        """A new session on the attached channel end (then, with a seed: the source's
        user and mount namespace descriptors, or none: a pidfd of it is taken here)."""
        if len(frame.fds) not in (1, 3):
            for fd in frame.fds:
                os.close(fd)
            raise ValueError("SPAWN needs one channel descriptor (and two namespaces)")
        chan_fd, ns = frame.fds[0], list(frame.fds[1:])
        seed = None
        try:
            request = Spawn.decode(frame)
            source, root = request.seed, check_root(request.root)
            if source is not None:
                root = self.roots.get(source)  # a copy stands on its source's image
                pid = self.sessions.get(source)
                if pid is None:
                    raise ValueError("the seed session is not a live session")
                # a pidfd pins the source: its pid cannot be reused while the copy opens it
                seed = (source, ns or [os.pidfd_open(pid)])
        except BaseException:  # no session comes of it: none of its descriptors stays
            for fd in (chan_fd, *ns):
                os.close(fd)
            raise
        try:
            return self._spawn(chan_fd, seed, root)
        finally:
            for fd in seed[1] if seed is not None else ns:
                os.close(fd)

    def _spawn(
        self, chan_fd: int, seed: tuple[str, list[int]] | None, root: dict[str, Any] | None
    ) -> Ok:
        lineage = _new_dir(self.base, "s")
        workdir = os.path.join(lineage, "w0")
        os.mkdir(workdir, 0o700)
        self.lineages[lineage] = {workdir}
        group = None
        if self.memcg is not None:
            try:
                group = self.memcg.create(os.path.basename(lineage))
            except OSError:
                self._release_dir(workdir)
                raise
        pid = self._fork_session(chan_fd, lineage, workdir, group, seed, root)
        os.close(chan_fd)
        self.sessions[workdir] = pid
        if root is not None:
            self.roots[workdir] = root
        return Ok(pid=pid, workdir=workdir)

    def _new_fork_dirs(self, src_workdir: str, n: int) -> list[str]:
        lineage = os.path.dirname(src_workdir)
        members = self.lineages.get(lineage)
        if members is None or src_workdir not in members:
            raise ValueError("fork source is not a live session")
        dirs = [_new_dir(lineage, "f") for _ in range(n)]
        members.update(dirs)
        return dirs

    def _release_dir(self, workdir: str) -> None:
        """Delete a session's directory, and its lineage's once the last member is gone."""
        lineage = os.path.dirname(workdir)
        members = self.lineages.get(lineage)
        if members is None or workdir not in members:
            return
        members.discard(workdir)
        self.roots.pop(workdir, None)
        _remove(workdir)
        if not members:
            del self.lineages[lineage]
            _remove(lineage)
            if self.memcg is not None:
                self.memcg.remove(os.path.basename(lineage))

    def _fork_session(
        self,
        chan_fd: int,
        lineage: str,
        workdir: str,
        group: str | None,
        seed: tuple[str, list[int]] | None = None,
        root: dict[str, Any] | None = None,
    ) -> int:
        """Fork and confine a session (the launch plan put what the layers need in our
        environment); in the child, serve it and never return."""
        chan = socket.socket(fileno=chan_fd)

        def prepare() -> None:
            if group is not None:  # first: everything the session allocates counts
                join(group)
            os.setsid()
            signal.set_wakeup_fd(-1)
            for signum in (signal.SIGCHLD, signal.SIGTERM):
                signal.signal(signum, signal.SIG_DFL)
            self.selector.close()
            for sock in (self.ctrl, self.wake_r, self.wake_w):
                sock.close()

        def failed(exc: BaseException) -> None:  # tell the parent why the session cannot start
            message = "".join(traceback.format_exception_only(type(exc), exc)).strip()
            send_message(chan, Error(message), 0)

        pid = fork_confined(
            workdir, lineage=lineage, prepare=prepare, failed=failed, seed=seed, root=root
        )
        if pid == 0 and self.image_python:
            try:
                exec_image_python(
                    self.image_python,
                    self.runtime_zip,
                    chan_fd,
                    max_output=self.max_output,
                    busy_poll=self.busy_poll,
                    state=json.dumps(_load_state()),
                )
            except OSError as exc:
                failed(OSError(exc.errno, f"cannot run the image's {self.image_python}: {exc}"))
                os._exit(71)
        if pid == 0:
            serve_session(chan, max_output=self.max_output, busy_poll=self.busy_poll)
        chan.detach()  # the descriptor is closed by the caller
        return pid

    def kill(self, workdir: str) -> Ok:
        pid = self.sessions.pop(workdir, None)
        statuses = self.sweep()
        code = self.status.pop(workdir, None)
        if code is None and pid is not None:
            code = statuses.get(pid)
        self._release_dir(workdir)
        return Ok(status=code)

    def discard(self, workdir: str) -> Ok:
        """Like KILL without waiting: SIGKILL the tree now, reap and clean up on SIGCHLD.

        For interpreters nobody needs an exit status from (finished fresh-process
        runs, unused spares): the server is free for the next request while the
        kernel tears the processes down.
        """
        pid = self.sessions.pop(workdir, None)
        if pid is None:  # already dead and reaped: the synchronous path
            return self.kill(workdir)
        self.discarding[pid] = workdir
        pending, targets = [pid], []
        while pending:
            current = pending.pop()
            targets.append(current)
            pending.extend(children_of(current))
        for target in targets:
            try:
                os.kill(target, signal.SIGKILL)
            except ProcessLookupError:
                continue
        return Ok(status=None)

    def handle(self, frame: Frame) -> Message:
        if frame.kind == Kind.SPAWN:
            return self.spawn(frame)
        if frame.kind == Kind.KILL:
            return self.kill(Kill.decode(frame).workdir)
        if frame.kind == Kind.DISCARD:
            return self.discard(Discard.decode(frame).workdir)
        if frame.kind == Kind.MKDIRS:
            mkdirs = Mkdirs.decode(frame)
            dirs = self._new_fork_dirs(mkdirs.src, int(mkdirs.n))
            self.forking += 1
            return Ok(workdirs=dirs)
        if frame.kind == Kind.ADOPT:
            for pid, workdir in Adopt.decode(frame).sessions:
                self.sessions[workdir] = int(pid)
            self.forking = max(0, self.forking - 1)
            return Ok()
        if frame.kind == Kind.RELEASE:
            for workdir in Release.decode(frame).workdirs:
                if workdir not in self.sessions:
                    self._release_dir(workdir)
            self.forking = max(0, self.forking - 1)
            return Ok()
        raise ValueError(f"unknown request kind {frame.kind}")

    # --- loop ---------------------------------------------------------------------

    def serve(self) -> None:
        signal.set_wakeup_fd(self.wake_w.fileno())
        signal.signal(signal.SIGCHLD, lambda signum, frame: None)
        self.selector.register(self.ctrl, selectors.EVENT_READ)
        self.selector.register(self.wake_r, selectors.EVENT_READ)
        while True:
            for key, _ in self.selector.select():
                if key.fileobj is self.wake_r:
                    try:
                        while self.wake_r.recv(4096):
                            pass
                    except BlockingIOError:
                        pass
                    self.reap()
                    continue
                try:
                    frame = recv_frame(self.ctrl, max_body=MAX_CONTROL)
                except (PeerClosed, OSError):
                    return
                self.reap()
                for fd in frame.fds if frame.kind != Kind.SPAWN else ():
                    os.close(fd)
                try:
                    reply = self.handle(frame)
                except Exception as exc:  # report to the parent, keep serving the others
                    reply = Error(f"{type(exc).__name__}: {exc}")
                send_message(self.ctrl, reply, frame.seq)

    def shutdown(self) -> None:
        """Kill every session and empty the base (which belongs to the parent)."""
        self.sessions.clear()
        self.discarding.clear()
        self.sweep()
        if self.memcg is not None:
            for lineage in list(self.lineages):
                self.memcg.remove(os.path.basename(lineage))
        try:
            with os.scandir(self.base) as entries:
                for entry in entries:
                    _remove(entry.path)
        except FileNotFoundError:  # the parent removed it already
            return


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="toolservices.python.runtime._forkserver")
    parser.add_argument("--fd", type=int, required=True, help="control socket descriptor")
    parser.add_argument("--base", required=True, help="directory for the sessions' workdirs")
    args = parser.parse_args(argv)
    ctrl = socket.socket(fileno=args.fd)
    # before any thread: the launcher raised the main stack's limit (sessions set their own)
    set_default_thread_stack(8 << 20)
    first = recv_frame(ctrl, max_body=MAX_CONTROL)
    if first.kind != Kind.CONFIG:
        sys.exit(f"expected CONFIG, got frame kind {first.kind}")
    config = Config.decode(first)
    failed: dict[str, str] = {}
    for name in config.preload:
        try:
            importlib.import_module(name)
        except Exception as exc:  # reported to the parent, which raises a UserError
            failed[name] = f"{type(exc).__name__}: {exc}"
    if config.preload_code:  # e.g. modules every session shares copy-on-write (ShellService's)
        try:
            exec(
                compile(config.preload_code, "<preload_code>", "exec"), {"__name__": "__preload__"}
            )
        except Exception as exc:  # reported like a failed preload
            failed["preload_code"] = f"{type(exc).__name__}: {exc}"
    session_ns = (_load_state() or {}).get("session_ns") or {}
    if session_ns.get("images"):
        preload_image_modules()
    gc.collect()
    gc.freeze()  # forked sessions then share these pages instead of copying them on first GC
    set_subreaper(True)
    # the launch plan may have mapped the base (e.g. inside bwrap): it comes from our argv
    server = ForkServer(ctrl, config, base=args.base)
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(0))
    ready = Ready(pid=os.getpid(), preload_failed=failed, python=sys.version.split()[0])
    send_message(ctrl, ready, first.seq)
    try:
        server.serve()
    finally:
        server.shutdown()


if __name__ == "__main__":
    main()
