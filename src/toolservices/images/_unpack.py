"""Unpack one layer tar into a directory that overlayfs can stack.

Every path is walked from the layer's root one component at a time with
``O_NOFOLLOW``, so no entry reaches outside the directory: an absolute name,
a ``..`` or a parent that an earlier entry laid as a symlink is an error, and
a hard link may only name a regular file of the same layer. Whiteouts become
overlayfs xattr whiteouts (``user.overlay.whiteout`` on an empty file, the
parent marked ``user.overlay.opaque=x``; kernel >= 6.7 with ``userxattr``),
opaque directories ``user.overlay.opaque=y``. Owners are not kept (the
session maps its own uid to 0, so every file is root's there); set-id bits
and device nodes are dropped.
"""

from __future__ import annotations

import errno
import hashlib
import os
import stat
import tarfile
from collections.abc import Callable
from typing import IO, Any

from ._errors import ImageError

__all__ = ["DigestReader", "decompressed", "remove_tree_at", "unpack_layer"]

_CHUNK = 1 << 20
_WHITEOUT = ".wh."
_OPAQUE = ".wh..wh..opq"
_XWHITEOUT = "user.overlay.whiteout"
_XOPAQUE = "user.overlay.opaque"
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class DigestReader:
    """A read-only stream that hashes what passes and checks it at the end."""

    def __init__(self, raw: IO[bytes], digest: str, what: str, size: int | None = None) -> None:
        algorithm, _, self._hex = digest.partition(":")
        if algorithm != "sha256" or len(self._hex) != 64:
            raise ImageError(f"{what}: unsupported digest {digest!r} (only sha256 is)")
        self._raw = raw
        self._hash = hashlib.sha256()
        self._what = what
        self._digest = digest
        self._size = size
        self.count = 0

    def read(self, n: int = -1) -> bytes:
        data = self._raw.read(n)
        self._hash.update(data)
        self.count += len(data)
        if self._size is not None and self.count > self._size:
            raise ImageError(f"{self._what}: longer than the {self._size} bytes its manifest says")
        return data

    def readable(self) -> bool:
        return True

    def drain_and_verify(self) -> None:
        """Read what is left, then raise unless size and digest match."""
        while self.read(_CHUNK):
            pass
        if self._size is not None and self.count != self._size:
            raise ImageError(
                f"{self._what}: {self.count} bytes, its manifest says {self._size} "
                "(truncated or corrupted)"
            )
        if self._hash.hexdigest() != self._hex:
            raise ImageError(
                f"{self._what}: content does not match its digest {self._digest} "
                f"(got sha256:{self._hash.hexdigest()}); the blob is corrupted"
            )


class _Peek:
    """Lets the first bytes be looked at before a decompressor reads them."""

    def __init__(self, raw: DigestReader) -> None:
        self._raw = raw
        self.head = raw.read(4)

    def read(self, n: int = -1) -> bytes:
        if self.head:
            if n < 0:
                data, self.head = self.head + self._raw.read(), b""
                return data
            data, self.head = self.head[:n], self.head[n:]
            return data + (self._raw.read(n - len(data)) if n > len(data) else b"")
        return self._raw.read(n)

    def readable(self) -> bool:
        return True


def decompressed(raw: DigestReader) -> IO[bytes]:
    """The layer's tar stream, by its magic bytes: gzip, zstd or plain."""
    peek = _Peek(raw)
    if peek.head.startswith(b"\x1f\x8b"):
        import gzip

        return gzip.GzipFile(fileobj=peek, mode="rb")  # type: ignore[call-overload,no-any-return]
    if peek.head == b"\x28\xb5\x2f\xfd":
        return _zstd_reader(peek)
    return peek  # type: ignore[return-value]


def _zstd_reader(stream: Any) -> IO[bytes]:
    try:
        from compression.zstd import ZstdFile
    except ImportError:
        try:
            from backports.zstd import ZstdFile
        except ImportError:
            raise ImageError(
                "this image has zstd-compressed layers; install toolservices[images] "
                "(backports.zstd) or use Python >= 3.14"
            ) from None
    return ZstdFile(stream, mode="rb")  # type: ignore[no-any-return]


def unpack_layer(stream: IO[bytes], dest: str, *, what: str, budget: Callable[[int], None]) -> int:
    """Unpack the tar ``stream`` into the empty directory ``dest``.

    ``budget(n)`` is told the bytes laid so far and raises to stop. Returns
    the bytes laid (file contents plus one block per entry).
    """
    root_fd = os.open(dest, _DIR_FLAGS)
    tree = _Tree(root_fd, what)
    laid = 0
    try:
        with tarfile.open(fileobj=stream, mode="r|") as archive:
            for member in archive:
                laid += tree.add(member, archive) + 512
                budget(laid)
        tree.finish()
    except (tarfile.TarError, EOFError, OSError) as exc:
        if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):
            raise ImageError(f"{what}: the image cache's disk is full ({exc})") from exc
        raise ImageError(
            f"{what}: not a readable layer tar (truncated or corrupted?): {exc}"
        ) from exc
    finally:
        tree.close()
    return laid


class _Tree:
    """The layer directory, reached only through directory descriptors."""

    def __init__(self, root_fd: int, what: str) -> None:
        self._fds: dict[str, int] = {"": root_fd}
        self._what = what
        self._dir_modes: dict[str, tuple[int, float]] = {}
        self._opaque: set[str] = set()

    def close(self) -> None:
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()

    def _split(self, name: str) -> tuple[str, str]:
        if name.startswith("/"):
            raise ImageError(f"{self._what}: entry {name!r} is an absolute path; refused")
        parts = [p for p in name.split("/") if p not in ("", ".")]
        if ".." in parts:
            raise ImageError(f"{self._what}: entry {name!r} leaves the image root; refused")
        if not parts:
            return "", ""
        return "/".join(parts[:-1]), parts[-1]

    def _dir(self, path: str) -> int:
        """The descriptor of directory ``path``, made if missing, never through a link (from
        its nearest ancestor with a descriptor down, without recursion: a layer may nest
        thousands of levels)."""
        missing: list[str] = []
        while path not in self._fds:
            missing.append(path)
            path = path.rpartition("/")[0]
        fd = self._fds[path]
        for path in reversed(missing):
            fd = self._open_dir(fd, path)
        return fd

    def _open_dir(self, parent_fd: int, path: str) -> int:
        leaf = path.rpartition("/")[2]
        try:
            fd = os.open(leaf, _DIR_FLAGS, dir_fd=parent_fd)
        except FileNotFoundError:
            os.mkdir(leaf, 0o755, dir_fd=parent_fd)
            fd = os.open(leaf, _DIR_FLAGS, dir_fd=parent_fd)
        except OSError as exc:
            if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                raise ImageError(
                    f"{self._what}: {path!r} is not a directory in this layer (a symlink or "
                    "file laid by an earlier entry): an entry under it would leave the root; "
                    "refused"
                ) from None
            raise
        self._fds[path] = fd
        return fd

    def _clear(self, parent_fd: int, path: str, leaf: str, keep_dir: bool) -> None:
        """Remove what an earlier entry laid at ``leaf`` (a tar may repeat a name)."""
        try:
            st = os.stat(leaf, dir_fd=parent_fd, follow_symlinks=False)
        except FileNotFoundError:
            return
        if stat.S_ISDIR(st.st_mode):
            if keep_dir:
                return
            remove_tree_at(parent_fd, leaf)
            below = path + "/"
            for key in [k for k in self._fds if k == path or k.startswith(below)]:
                os.close(self._fds.pop(key))
            for key in [k for k in self._dir_modes if k == path or k.startswith(below)]:
                del self._dir_modes[key]  # gone: nothing to set at the end
        else:
            os.unlink(leaf, dir_fd=parent_fd)

    def add(self, member: tarfile.TarInfo, archive: tarfile.TarFile) -> int:
        parent, leaf = self._split(member.name)
        if not leaf:
            return 0  # the root itself
        parent_fd = self._dir(parent)
        path = f"{parent}/{leaf}" if parent else leaf
        if leaf == _OPAQUE:
            os.setxattr(parent_fd, _XOPAQUE, b"y")
            self._opaque.add(parent)
            return 0
        if leaf.startswith(_WHITEOUT):
            hidden = leaf[len(_WHITEOUT) :]
            self._clear(parent_fd, f"{parent}/{hidden}" if parent else hidden, hidden, False)
            fd = os.open(
                hidden,
                os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW,
                0o644,
                dir_fd=parent_fd,
            )
            try:
                os.setxattr(fd, _XWHITEOUT, b"y")
            finally:
                os.close(fd)
            if parent not in self._opaque:
                os.setxattr(parent_fd, _XOPAQUE, b"x")
            return 0
        self._clear(parent_fd, path, leaf, member.isdir())
        mode = member.mode & 0o1777
        if member.isdir():
            self._dir(path)
            self._dir_modes[path] = (mode, member.mtime)
            return 0
        if member.isreg():
            return self._file(parent_fd, leaf, member, archive, mode)
        if member.issym():
            os.symlink(member.linkname, leaf, dir_fd=parent_fd)
        elif member.islnk():
            self._hardlink(parent_fd, leaf, member)
            return 0
        elif member.isfifo():
            os.mkfifo(leaf, mode, dir_fd=parent_fd)
        else:
            return 0  # device nodes cannot be made without privilege: dropped
        os.utime(leaf, (member.mtime, member.mtime), dir_fd=parent_fd, follow_symlinks=False)
        return 0

    def _file(
        self,
        parent_fd: int,
        leaf: str,
        member: tarfile.TarInfo,
        archive: tarfile.TarFile,
        mode: int,
    ) -> int:
        source = archive.extractfile(member)
        fd = os.open(
            leaf,
            os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
            0o600,
            dir_fd=parent_fd,
        )
        try:
            left = member.size
            while left > 0 and source is not None:
                chunk = source.read(min(left, _CHUNK))
                if not chunk:
                    raise ImageError(f"{self._what}: entry {member.name!r} is cut short")
                _write_all(fd, chunk)
                left -= len(chunk)
            os.fchmod(fd, mode)
            os.utime(fd, (member.mtime, member.mtime))
        finally:
            os.close(fd)
        return member.size

    def _hardlink(self, parent_fd: int, leaf: str, member: tarfile.TarInfo) -> None:
        target_parent, target_leaf = self._split(member.linkname)
        if not target_leaf:
            raise ImageError(f"{self._what}: hard link {member.name!r} names the root; refused")
        target_fd = self._dir(target_parent)
        try:
            st = os.stat(target_leaf, dir_fd=target_fd, follow_symlinks=False)
        except FileNotFoundError:
            st = None
        if st is None or not stat.S_ISREG(st.st_mode):
            raise ImageError(
                f"{self._what}: hard link {member.name!r} -> {member.linkname!r} does not name a "
                "regular file laid earlier in this layer; refused"
            )
        os.link(
            target_leaf, leaf, src_dir_fd=target_fd, dst_dir_fd=parent_fd, follow_symlinks=False
        )

    def finish(self) -> None:
        """Directory modes and times last, deepest first (so writing into them went through)."""
        for path in sorted(self._dir_modes, key=lambda p: p.count("/"), reverse=True):
            mode, mtime = self._dir_modes[path]
            fd = self._dir(path)
            os.fchmod(fd, mode | stat.S_IRWXU)
            os.utime(fd, (mtime, mtime))


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def remove_tree_at(parent_fd: int, leaf: str) -> None:
    """Remove the directory ``leaf`` of ``parent_fd`` and its tree, never following a link,
    without recursion (a layer may nest thousands of levels), each directory made writable
    by its owner first (a layer may lay them without write permission)."""
    stack = [(parent_fd, leaf, os.open(leaf, _DIR_FLAGS, dir_fd=parent_fd))]
    try:
        while stack:
            _parent, _name, fd = stack[-1]
            os.fchmod(fd, 0o700)
            child = None
            for entry in os.listdir(fd):
                st = os.stat(entry, dir_fd=fd, follow_symlinks=False)
                if stat.S_ISDIR(st.st_mode):
                    child = entry
                    break
                os.unlink(entry, dir_fd=fd)
            if child is not None:
                stack.append((fd, child, os.open(child, _DIR_FLAGS, dir_fd=fd)))
                continue
            stack.pop()
            os.close(fd)
            os.rmdir(_name, dir_fd=_parent)
    finally:
        for _parent, _name, fd in stack:
            os.close(fd)
