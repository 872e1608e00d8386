"""Seeding a new session's working directory with a copy of another session's files.

Runtime side, standard library only. A session made this way is a fresh
session (its own namespaces, disk quota and working directory), not a fork of
the source: only the files travel. The source's directory lives in the
source's own mount namespace (a private tmpfs), so it is reached like this:

1. the fork server forks the new session with descriptors of the source's
   user and mount namespaces (which the source's worker handed the parent in
   its HELLO, before any user code ran: a non-dumpable process's
   namespaces cannot be opened from outside), or else a pidfd of the source;
2. before the new session makes its own namespaces, it forks a short-lived
   helper that enters the source's user and mount namespaces (it may: the
   same uid owns them and it is still in their parent user namespace), opens
   the source's directory and passes that one descriptor back, then exits;
3. the new session makes its namespaces, drops its capabilities and, before
   its Landlock and seccomp layers, copies the tree from that descriptor into
   its own directory (:func:`copy_into`), then closes it. User code never
   sees the descriptor.

The copy resolves every name relative to an open directory with no symlink
followed (``openat2`` with ``RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS``, or one
component at a time with ``O_NOFOLLOW``): a planted ``ln -s /etc x`` is
copied as a symlink, never read through, so a copy gets no file its own
shell could not read.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import socket
import stat
from collections.abc import Iterator

from ._linux import SetupError, check, die_with_parent, libc

__all__ = ["copy_into", "open_seed"]

_CLONE_NEWNS = 0x00020000
_PR_SET_DUMPABLE = 4
_CLONE_NEWUSER = 0x10000000
_SYS_OPENAT2 = 437  # the same on every architecture (a "new" syscall number)
_RESOLVE_NO_XDEV = 0x01
_RESOLVE_NO_MAGICLINKS = 0x02
_RESOLVE_NO_SYMLINKS = 0x04
_RESOLVE_BENEATH = 0x08
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_openat2_works = True
#: this process's umask (read once: setting it is the only way to read it)
_UMASK = os.umask(0o022)
os.umask(_UMASK)


class _OpenHow(ctypes.Structure):
    _fields_ = [("flags", ctypes.c_uint64), ("mode", ctypes.c_uint64), ("resolve", ctypes.c_uint64)]


def open_seed(ns: list[int], path: str, *, enter: bool, reveal: str | None = None) -> int:
    """A read-only descriptor of directory ``path`` as the source session sees it.

    ``ns``: descriptors of the source's user and mount namespaces, or one
    pidfd of it. With ``enter`` a helper process joins those namespaces to
    open it (the caller must still be in their parent user namespace);
    without, the path is opened here (a shared namespace). ``reveal``: a mount
    point the helper detaches first, in a private copy of the source's mount
    namespace (an image session hides its writable layer under one).
    """
    if not enter:
        return _open_no_symlinks(path)
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    pid = os.fork()
    if pid == 0:  # the helper: never returns
        try:
            ours.close()
            die_with_parent()
            # closed to the source's processes: not dumpable, and nothing but what it needs
            libc().prctl(_PR_SET_DUMPABLE, 0, 0, 0, 0)
            keep = {0, 1, 2, theirs.fileno(), *ns}
            for name in os.listdir("/proc/self/fd"):
                if int(name) not in keep:
                    try:
                        os.close(int(name))
                    except OSError:
                        pass  # the listing's own descriptor
            if len(ns) == 2:  # the user namespace first: it grants the right to the other
                check(libc().setns(ns[0], _CLONE_NEWUSER), "setns(the source's user namespace)")
                check(libc().setns(ns[1], _CLONE_NEWNS), "setns(the source's mount namespace)")
            else:
                check(libc().setns(ns[0], _CLONE_NEWUSER | _CLONE_NEWNS), "setns(source pidfd)")
            if reveal is not None:  # the source's own view stays as it is
                check(libc().unshare(_CLONE_NEWNS), "unshare(a copy of the source's mounts)")
                check(libc().umount2(reveal.encode(), 2), f"umount2({reveal!r})")
            fd = _open_no_symlinks(path)
            socket.send_fds(theirs, [b"k"], [fd])
        except BaseException as exc:
            try:
                theirs.sendall(b"e" + f"{type(exc).__name__}: {exc}".encode()[:400])
            finally:
                os._exit(1)
        os._exit(0)
    theirs.close()
    try:
        message, fds, _flags, _addr = socket.recv_fds(ours, 512, 1)
    finally:
        ours.close()
        os.waitpid(pid, 0)
    if not fds:
        why = message[1:].decode("utf-8", "replace") or "the helper died"
        raise SetupError(f"cannot open the source session's directory: {why}")
    return fds[0]


def _open_no_symlinks(path: str) -> int:
    """Open directory ``path`` (absolute) following no symlink on the way.

    The source session may plant one in a directory of the path it can write
    (its own ``/dev/shm`` at L2), and whoever opens this is outside its Landlock.
    """
    top = os.open("/", _DIR_FLAGS)
    try:
        return _open_beneath(top, path.strip("/"), _DIR_FLAGS, cross_mounts=True)
    finally:
        os.close(top)


def _open_beneath(root: int, rel: str, flags: int, *, cross_mounts: bool = False) -> int:
    """Open ``rel`` (a relative path of directories) below ``root`` following no symlink.

    A path longer than one system call takes (a deep tree) is opened a part at a time.
    ``cross_mounts``: a path may pass mount points (not within a copied tree).
    """
    if not rel:
        return os.open(".", flags, dir_fd=root)
    parts = rel.split("/")
    current = root
    try:
        while parts:
            take, size = 0, 0
            while take < len(parts) and size + len(parts[take]) < _CHUNK:
                size += len(parts[take]) + 1
                take += 1
            chunk, parts = "/".join(parts[: max(take, 1)]), parts[max(take, 1) :]
            nxt = _open_chunk(
                current, chunk, flags if not parts else _DIR_FLAGS, cross_mounts=cross_mounts
            )
            if current != root:
                os.close(current)
            current = nxt
    except BaseException:
        if current != root:
            os.close(current)
        raise
    return current


#: bytes of path given to one openat2 (PATH_MAX is 4096)
_CHUNK = 2048


def _open_chunk(root: int, rel: str, flags: int, *, cross_mounts: bool = False) -> int:
    global _openat2_works
    if _openat2_works:
        resolve = _RESOLVE_BENEATH | _RESOLVE_NO_SYMLINKS | _RESOLVE_NO_MAGICLINKS
        how = _OpenHow(flags, 0, resolve if cross_mounts else resolve | _RESOLVE_NO_XDEV)
        path = rel.encode("utf-8", "surrogateescape")
        fd = libc().syscall(_SYS_OPENAT2, root, path, ctypes.byref(how), ctypes.sizeof(how))
        if fd >= 0:
            return int(fd)
        err = ctypes.get_errno()
        if err not in (errno.ENOSYS, errno.E2BIG, errno.EAGAIN):
            raise OSError(err, os.strerror(err), rel)
        if err != errno.EAGAIN:
            _openat2_works = False
    current = os.open(".", _DIR_FLAGS, dir_fd=root)  # one component at a time
    try:
        for part in rel.split("/"):
            nxt = os.open(part, _DIR_FLAGS, dir_fd=current)
            os.close(current)
            current = nxt
    except BaseException:
        os.close(current)
        raise
    return current


def _send(dst: int, src: int, offset: int, end: int) -> None:
    """Copy bytes ``offset``..``end`` of ``src`` to the same place in ``dst`` (in the kernel)."""
    if offset:
        os.lseek(dst, offset, os.SEEK_SET)
    while offset < end:
        sent = os.sendfile(dst, src, offset, end - offset)
        if sent == 0:  # the source shrank meanwhile
            return
        offset += sent


def _send_sparse(dst: int, src: int, size: int) -> None:
    """Copy only the data runs of ``src``: its holes stay holes in ``dst``."""
    pos = 0
    while pos < size:
        try:
            start = os.lseek(src, pos, os.SEEK_DATA)
        except OSError as exc:
            if exc.errno == errno.ENXIO:  # only a hole is left
                return
            raise
        pos = os.lseek(src, start, os.SEEK_HOLE)
        _send(dst, src, start, pos)


def _skipped(exc: OSError) -> bool:
    """An error that skips one entry: it went away or changed kind meanwhile (a job of the
    source still runs), the source closed it to itself, or a process of the source holds a
    write lease on it (opening it would have to wait for the lease to be broken)."""
    return exc.errno in _SKIP


_SKIP = (
    errno.ENOENT,
    errno.ENOTDIR,
    errno.ELOOP,
    errno.EACCES,
    errno.EPERM,
    errno.ENXIO,
    errno.EINVAL,
    errno.EAGAIN,
)


def _copy_file(src_dir: int, dst_dir: int, name: str) -> bool:
    """Copy one regular file (holes stay holes; mode and times kept); False: skipped."""
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    try:
        src = os.open(name, flags, dir_fd=src_dir)
    except OSError as exc:
        if _skipped(exc):
            return False
        raise
    try:
        now = os.fstat(src)
        if not stat.S_ISREG(now.st_mode):  # swapped for a FIFO or a device meanwhile
            return False
        mode = stat.S_IMODE(now.st_mode)
        create = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC
        dst = os.open(name, create, mode, dir_fd=dst_dir)  # writable: it is new
        try:
            size = now.st_size
            if now.st_blocks * 512 >= size:  # no holes: one run (most files)
                _send(dst, src, 0, size)
            else:
                _send_sparse(dst, src, size)
                os.ftruncate(dst, size)  # a hole at the end
            if mode & _UMASK:
                os.fchmod(dst, mode)
            os.utime(dst, ns=(now.st_atime_ns, now.st_mtime_ns))
        finally:
            os.close(dst)
    finally:
        os.close(src)
    return True


#: below this many bytes of files a copy is not worth a second process
PARALLEL_BYTES = 8 << 20


def copy_into(src_root: int, dst_path: str, *, workers: int | None = None) -> None:
    """Copy the tree below directory descriptor ``src_root`` into directory ``dst_path``.

    Regular files (content with holes, permission bits, times), directories
    (permission bits, applied last so that a 0o500 one is still filled) and
    symlinks (as links, never followed); hard links within the tree stay
    links. FIFOs, sockets and devices are skipped, and so is what the source
    made unreadable to itself. Iterative and by relative names: deep trees
    hold two descriptors at a time. First the tree's directories and
    symlinks are made, then the files' contents are copied, by ``workers``
    processes (default: two when there are two CPUs and enough bytes; the
    copy is the kernel's page copying, which then runs on both).
    """
    dst_root = os.open(dst_path, _DIR_FLAGS)
    try:
        tree = _Tree(src_root, dst_root)
        tree.walk()
        if workers is None:
            cpus = len(os.sched_getaffinity(0))
            workers = 2 if cpus >= 2 and tree.size >= PARALLEL_BYTES else 1
        try:
            tree.copy_files(workers)
            tree.finish()
        finally:
            tree.src.close()
            tree.dst.close()
    finally:
        os.close(dst_root)


class _Tree:
    """One copy: the walk's findings, then the files, then links and directory modes."""

    def __init__(self, src_root: int, dst_root: int) -> None:
        self.dst_root = dst_root
        self.src, self.dst = _Opener(src_root), _Opener(dst_root)
        self.files: dict[str, list[tuple[str, int]]] = {}  # name and size, by directory
        self.size = 0
        self.links: list[tuple[str, str]] = []  # (first path, another name of it)
        self.dirs: list[tuple[str, int, int]] = []  # relative path, mode, mtime_ns

    def walk(self) -> None:
        """Make the directories and symlinks; list the files (and hard links) to copy."""
        first: dict[tuple[int, int], str] = {}
        pending = [""]
        while pending:
            rel = pending.pop()
            with self._both(rel) as dirs:
                if dirs is None:
                    continue
                src_dir, dst_dir = dirs
                with os.scandir(src_dir) as entries:
                    names = [entry.name for entry in entries]
                for name in names:
                    try:
                        self._entry(src_dir, dst_dir, rel, name, first, pending)
                    except OSError as exc:
                        if not _skipped(exc):
                            raise

    @contextlib.contextmanager
    def _both(self, rel: str) -> Iterator[tuple[int, int] | None]:
        """Directory ``rel`` open in the source and the copy; None: gone from the source.

        The descriptors are borrowed from the openers (valid until the next call).
        """
        try:
            src_dir = self.src.open(rel)
        except OSError as exc:
            if not _skipped(exc):
                raise
            yield None
            return
        yield src_dir, self.dst.open(rel)

    def _entry(
        self,
        src_dir: int,
        dst_dir: int,
        rel: str,
        name: str,
        first: dict[tuple[int, int], str],
        pending: list[str],
    ) -> None:
        child = f"{rel}/{name}" if rel else name
        info = os.stat(name, dir_fd=src_dir, follow_symlinks=False)
        kind = info.st_mode
        if stat.S_ISLNK(kind):
            os.symlink(os.readlink(name, dir_fd=src_dir), name, dir_fd=dst_dir)
        elif stat.S_ISDIR(kind):
            os.mkdir(name, 0o700, dir_fd=dst_dir)
            self.dirs.append((child, stat.S_IMODE(kind), info.st_mtime_ns))
            pending.append(child)
        elif stat.S_ISREG(kind):
            if info.st_nlink > 1:
                key = (info.st_dev, info.st_ino)
                if key in first:
                    self.links.append((first[key], child))
                    return
                first[key] = child
            self.files.setdefault(rel, []).append((name, info.st_size))
            self.size += info.st_size

    def copy_files(self, workers: int) -> None:
        """Copy the listed files, the bytes spread over ``workers`` processes."""
        shares: list[dict[str, list[tuple[str, int]]]] = [{} for _ in range(workers)]
        loads = [0] * workers
        for rel, entries in self.files.items():
            for entry in entries:
                least = loads.index(min(loads))
                shares[least].setdefault(rel, []).append(entry)
                loads[least] += entry[1] + 4096  # a file costs more than its bytes
        helpers: list[tuple[int, int]] = []
        try:
            for share in shares[1:]:
                helpers.append(self._start(share))
            self._copy(shares[0])
        finally:
            failures = [why for why in (_finish(pid, fd) for pid, fd in helpers) if why]
        if failures:
            raise SetupError(f"copying the source's files failed: {failures[0]}")

    def _start(self, share: dict[str, list[tuple[str, int]]]) -> tuple[int, int]:
        """A process copying ``share``; it says why on the pipe if it fails."""
        read_fd, write_fd = os.pipe2(os.O_CLOEXEC)
        pid = os.fork()
        if pid == 0:
            code = 0
            try:
                os.close(read_fd)
                die_with_parent()
                self._copy(share)
            except BaseException as exc:
                code = 1
                os.write(write_fd, f"{type(exc).__name__}: {exc}".encode()[:400])
            finally:
                os._exit(code)
        os.close(write_fd)
        return pid, read_fd

    def _copy(self, share: dict[str, list[tuple[str, int]]]) -> None:
        for rel, entries in share.items():
            with self._both(rel) as dirs:
                if dirs is not None:
                    for name, _size in entries:
                        _copy_file(*dirs, name)

    def finish(self) -> None:
        """Hard links, then the directories' own modes and times (deepest first)."""
        root = self.dst_root
        for target, name in self.links:
            try:  # within the copy's own new tree, which nothing else can touch yet
                os.link(target, name, src_dir_fd=root, dst_dir_fd=root)
            except OSError:
                continue  # its first name was skipped (unreadable), or beyond PATH_MAX
        for rel, mode, mtime in reversed(self.dirs):
            fd = self.dst.open(rel)
            os.fchmod(fd, mode)
            os.utime(fd, ns=(mtime, mtime))


class _Opener:
    """Opens directories of one tree by relative path, each from its nearest open ancestor.

    It keeps the chain of the last directory's ancestors open (the deepest
    ``_CHAIN`` of them): a walk that goes down one level, or to a sibling,
    opens one name, so copying a tree costs time linear in its size, not in
    its size times its depth (reopening every directory from the top).
    """

    def __init__(self, root: int) -> None:
        self.root = root
        self.chain: list[tuple[str, int]] = []  # (relative path, fd): each an ancestor of the next

    def open(self, rel: str) -> int:
        """A descriptor of directory ``rel`` (borrowed: valid until the next call)."""
        while self.chain:
            top, fd = self.chain[-1]
            if rel == top:
                return fd
            if rel.startswith(top + "/"):
                base, done, rest = fd, top + "/", rel[len(top) + 1 :].split("/")
                break
            os.close(self.chain.pop()[1])
        else:
            if not rel:
                return self.root
            base, done, rest = self.root, "", rel.split("/")
        # far from every open ancestor (on the way back up a deep tree): open the deepest
        # _CHAIN of the ancestors on the way, so that the next ones up are open already
        skip = max(0, len(rest) - _CHAIN)
        steps = (["/".join(rest[:skip])] if skip else []) + rest[skip:]
        for step in steps:
            base = _open_beneath(base, step, _DIR_FLAGS)
            done += step
            self.chain.append((done, base))
            done += "/"
            if len(self.chain) > _CHAIN:
                os.close(self.chain.pop(0)[1])
        return base

    def close(self) -> None:
        for _rel, fd in self.chain:
            os.close(fd)
        self.chain.clear()


#: ancestors an opener keeps open (two openers: twice as many descriptors)
_CHAIN = 64


def _finish(pid: int, fd: int) -> str:
    """Wait for a copying process; why it failed, or ""."""
    try:
        why = os.read(fd, 512).decode("utf-8", "replace")
    finally:
        os.close(fd)
    _, status = os.waitpid(pid, 0)
    if status != 0 and not why:
        why = f"a copying process ended with status {os.waitstatus_to_exitcode(status)}"
    return why
