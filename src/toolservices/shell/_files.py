"""The file tools of a shell session (inside the session, standard library only).

Sent to the session with ``_supervisor`` (see there), which calls these with
the session's rights and no more: ``write_file``, ``read_file``,
``list_files``, ``put_archive``, ``get_archive``. A file is pinned with
``O_PATH`` before it is opened, so neither a FIFO, a device, a lease nor one
of the supervisor's own descriptors can make a tool hang or leak (see
:func:`_open_regular`).
"""

from __future__ import annotations

import base64
import errno
import os
import stat
from typing import Any


def write_file(full: str, data_b64: str, mode: int) -> dict[str, Any]:
    data = base64.b64decode(data_b64)
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


def read_file(full: str, max_file: int) -> dict[str, Any]:
    try:
        fd = _open_regular(full, os.O_RDONLY)
        try:
            info = os.fstat(fd)
            if info.st_size > max_file:
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
                if total > max_file:
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


def list_files(full: str, limit: int) -> dict[str, Any]:
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
