"""An image as the session's root: overlayfs over the cached layers, then pivot_root.

Kept in one function (:func:`enter_image_root`) so the session set-up calls
it once, after its user and mount namespaces exist and this process's uid
is mapped to 0 there (the image's files, owned by the user who pulled them,
are then root's, and the session may change any of them, as the image's root
could). The writable layer (``upper``, ``work``) lives where the caller puts
it: on the session's disk-quota tmpfs, so what a session installs counts
against its quota and goes when it closes.

Overlay mount options are limited to one page: like containerd, the layers
are named relative to their common directory (we ``chdir`` there first), so
about 60 layers of 64-hex names fit. ``userxattr`` (kernel >= 5.11) makes
overlayfs read the ``user.overlay.*`` whiteouts and opaque markers the
image cache lays (kernel >= 6.7 for whiteouts as xattrs).
"""

from __future__ import annotations

import ctypes
import os
import stat
from collections.abc import Sequence
from typing import Any

from ._linux import SetupError, check, libc, mount

__all__ = [
    "MAX_OVERLAY_OPTIONS",
    "apply_root_env",
    "check_root",
    "enter_image_root",
    "overlay_options",
]

MAX_OVERLAY_OPTIONS = 4095
_MS_BIND = 4096
_MS_REC = 16384
_MS_RDONLY = 1
_MS_NOSUID = 2
_MS_NODEV = 4
_MS_NOEXEC = 8
_MS_REMOUNT = 32
_MNT_DETACH = 2
# pivot_root has no libc wrapper: its syscall number (asm/unistd.h) by architecture.
_SYS_PIVOT_ROOT = {"x86_64": 155, "aarch64": 41, "riscv64": 41, "ppc64le": 203, "s390x": 217}
_OLD = ".toolservices-old-root"


_DEVICES = ("null", "zero", "full", "random", "urandom", "tty")
_DEV_LINKS = (
    ("fd", "/proc/self/fd"),
    ("stdin", "/proc/self/fd/0"),
    ("stdout", "/proc/self/fd/1"),
    ("stderr", "/proc/self/fd/2"),
    ("ptmx", "pts/ptmx"),
)


def _private_dev(inside: str) -> None:
    """A ``/dev`` of the session's own (a small tmpfs) with the usual device nodes bound
    from the outer ``/dev``, ``pts`` and the ``/proc/self/fd`` links: what it writes there
    no other session sees."""
    os.makedirs(inside, 0o755, exist_ok=True)
    mount("tmpfs", inside, "tmpfs", _MS_NOSUID, "size=64k,mode=0755")
    for name in _DEVICES:
        source = f"/dev/{name}"
        if os.path.exists(source):
            target = os.path.join(inside, name)
            os.close(os.open(target, os.O_CREAT | os.O_WRONLY | os.O_CLOEXEC, 0o666))
            mount(source, target, None, _MS_BIND, None)
    if os.path.isdir("/dev/pts"):
        os.mkdir(os.path.join(inside, "pts"), 0o755)
        mount("/dev/pts", os.path.join(inside, "pts"), None, _MS_BIND | _MS_REC, None)
    for name, target in _DEV_LINKS:
        os.symlink(target, os.path.join(inside, name))


def overlay_options(lowerdirs: Sequence[str], upper: str, work: str) -> tuple[str, str]:
    """``(directory to chdir to, mount options)`` for layers listed top first.

    Layers sharing one parent directory (the image cache's ``layers/``) are
    named relative to it; others keep their absolute paths.
    """
    parents = {os.path.dirname(p) for p in lowerdirs}
    base = parents.pop() if len(parents) == 1 else "/"
    names = [os.path.basename(p) if base != "/" else p for p in lowerdirs]
    for name in names:
        if any(c in name for c in ",:\\") or not name:
            raise SetupError(f"an image layer path cannot be used by overlayfs: {name!r}")
    options = f"lowerdir={':'.join(names)},upperdir={upper},workdir={work},userxattr"
    if len(options) > MAX_OVERLAY_OPTIONS:
        raise SetupError(
            f"the image has too many layers for one overlay mount ({len(lowerdirs)}; "
            f"{len(options)} bytes of options, at most {MAX_OVERLAY_OPTIONS})"
        )
    return base, options


def enter_image_root(
    lowerdirs: Sequence[str],
    *,
    upper_base: str,
    binds: Sequence[str] = ("/proc", "/dev"),
) -> str:
    """Make the image (``lowerdirs``, top first) with a private writable layer this root.

    ``upper_base`` (an empty directory on the session's own tmpfs) gets the
    overlay's ``upper``, ``work`` and mount point ``root``. Each path in
    ``binds`` (``/proc``, ``/dev``, the session's ``/tmp``, its workspace...) is
    bound at the same path inside, recursively, made when the image lacks it;
    ``/proc`` read-only.
    Returns the mount point as it was seen before the switch.
    """
    upper, work, root = (os.path.join(upper_base, n) for n in ("upper", "work", "root"))
    for path in (upper, work, root):
        os.makedirs(path, 0o755, exist_ok=True)
    base, options = overlay_options(lowerdirs, upper, work)
    here = os.getcwd()
    os.chdir(base)
    try:
        mount("overlay", root, "overlay", 0, options)
    finally:
        os.chdir(here)
    for path in binds:
        if not os.path.exists(path):
            continue
        inside = os.path.join(root, path.lstrip("/"))
        if path == "/dev":
            _private_dev(inside)
            continue
        if os.path.isdir(path):
            os.makedirs(inside, 0o755, exist_ok=True)
        else:
            os.makedirs(os.path.dirname(inside), 0o755, exist_ok=True)
            if not os.path.exists(inside):
                os.close(os.open(inside, os.O_CREAT | os.O_WRONLY | os.O_CLOEXEC, 0o644))
        mount(path, inside, None, _MS_BIND | _MS_REC, None)
        if path == "/proc":  # read, never written (Landlock may grant writes to all of /)
            flags = _MS_BIND | _MS_REMOUNT | _MS_RDONLY | _MS_NOSUID | _MS_NODEV | _MS_NOEXEC
            mount("none", inside, None, flags, None)
    old = os.path.join(root, _OLD)
    os.makedirs(old, 0o700, exist_ok=True)
    lib = libc()
    number = _SYS_PIVOT_ROOT.get(os.uname().machine)
    if number is None:
        raise SetupError(f"pivot_root: unknown syscall number on {os.uname().machine}")
    check(lib.syscall(number, root.encode(), old.encode()), "pivot_root (image root)")
    os.chdir("/")
    check(lib.umount2(f"/{_OLD}".encode(), _MNT_DETACH), "umount2 (the old root)")
    os.rmdir(f"/{_OLD}")
    return root


# --- the session's side: one call in the session set-up -------------------------------

# What the session's (host) interpreter imports after the switch, loaded before it: the
# shell supervisor and spawner, put_archive/get_archive. The image has its own /usr.
_PRELOAD = (
    "array",
    "base64",
    "bz2",
    "errno",
    "fcntl",
    "gzip",
    "io",
    "json",
    "lzma",
    "select",
    "signal",
    "socket",
    "stat",
    "struct",
    "tarfile",
    "time",
    "typing",
    "zlib",
)


def upper_of(lineage: str) -> tuple[str, str]:
    """``(the directory hiding it, the writable layer)`` of the image session in ``lineage``."""
    base = os.path.join(lineage, ".image-root")
    return base, os.path.join(base, "upper")


def preload_image_modules() -> None:
    """Import what a session's interpreter needs from the host's standard library once it
    stands on an image (whose ``/usr`` is its own): in the fork server, so that every
    session shares these pages instead of importing them itself; in a session when the
    server did not (no-ops when it did)."""
    for name in _PRELOAD:
        try:
            __import__(name)
        except ImportError:  # an interpreter built without bz2 or lzma
            continue


def enter_session_root(
    lowerdirs: Sequence[str], *, lineage: str, binds: Sequence[str], upper_seed: int | None = None
) -> None:
    """The session set-up's one call: preload, then :func:`enter_image_root` with the
    writable layer in the session's lineage (its quota tmpfs) and its paths bound in.
    ``upper_seed``: a ``fork_session`` source's writable layer, copied in first."""
    if upper_seed is not None:
        upper = upper_of(lineage)[1]
        os.makedirs(upper, 0o755, exist_ok=True)
        dest = os.open(upper, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            copy_layer(upper_seed, dest)
        finally:
            os.close(dest)
    preload_image_modules()
    upper_base = upper_of(lineage)[0]
    os.makedirs(upper_base, 0o700, exist_ok=True)
    enter_image_root(lowerdirs, upper_base=upper_base, binds=("/proc", "/dev", *binds, lineage))
    # The writable layer is the overlay's business: hidden from the session (the mount holds it).
    mount("tmpfs", upper_base, "tmpfs", _MS_RDONLY | _MS_NOSUID | _MS_NODEV, "size=4k,mode=0500")


def copy_layer(src: int, dest: int) -> None:
    """Copy an overlay writable layer (directory descriptors): files, directories, symlinks,
    whiteouts (0/0 character devices) and the ``user.*`` xattrs overlayfs keeps (opaque
    directories, xattr whiteouts), following no symlink."""
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC
    _copy_xattrs(src, dest)
    for name in os.listdir(src):
        st = os.stat(name, dir_fd=src, follow_symlinks=False)
        mode = stat.S_IMODE(st.st_mode)
        if stat.S_ISDIR(st.st_mode):
            os.mkdir(name, 0o700, dir_fd=dest)
            sub_src = os.open(name, flags | os.O_DIRECTORY, dir_fd=src)
            sub_dest = os.open(name, flags | os.O_DIRECTORY, dir_fd=dest)
            try:
                copy_layer(sub_src, sub_dest)
                os.fchmod(sub_dest, mode)
            finally:
                os.close(sub_src)
                os.close(sub_dest)
        elif stat.S_ISREG(st.st_mode):
            fin = os.open(name, flags, dir_fd=src)
            fout = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | flags, 0o600, dir_fd=dest)
            try:
                while os.sendfile(fout, fin, None, 1 << 30):
                    pass
                _copy_xattrs(fin, fout)
                os.fchmod(fout, mode)
                os.utime(fout, ns=(st.st_atime_ns, st.st_mtime_ns))
            finally:
                os.close(fin)
                os.close(fout)
        elif stat.S_ISLNK(st.st_mode):
            os.symlink(os.readlink(name, dir_fd=src), name, dir_fd=dest)
        elif stat.S_ISCHR(st.st_mode) and st.st_rdev == 0:  # a whiteout
            os.mknod(name, stat.S_IFCHR | mode, 0, dir_fd=dest)


def _copy_xattrs(src: int, dest: int) -> None:
    for attr in os.listxattr(src):
        if attr.startswith("user."):
            os.setxattr(dest, attr, os.getxattr(src, attr))


def root_landlock_paths(own_proc: bool) -> tuple[list[str], list[str]]:
    """Landlock's (read, write) lists in an image root: read all of it; with a ``/proc`` of
    the session's own (its own PID namespace), write all of it, so that new top-level
    directories can be made (``mkdir /opt``, a ``WorkingDir`` of ``/newtop/app``); what
    the session may not change there (``/sys``, ``/proc/sys``, the devices) is the real
    root's, whom its user namespace does not map. Without one, every top-level directory
    but ``/proc`` and ``/sys``, not ``/`` itself: a rule there would reach the shared
    ``/proc``, where the other sessions' processes (the same uid outside) have files this
    session would own."""
    if own_proc:
        return ["/"], ["/"]
    write = [
        f"/{name}"
        for name in sorted(os.listdir("/"))
        if name not in ("proc", "sys") and os.path.isdir(f"/{name}")
    ]
    return ["/"], write


def check_root(root: object) -> dict[str, Any] | None:
    """A SPAWN request's ``root`` (see ``_protocol.Spawn``) checked: absolute layer paths,
    an environment of names to strings or None; ValueError naming what is wrong."""
    if root is None:
        return None
    if not isinstance(root, dict):
        raise ValueError("SPAWN root must be an object")
    layers, env = root.get("layers"), root.get("env", {})
    if (
        not isinstance(layers, list)
        or not layers
        or not all(isinstance(p, str) and p.startswith("/") for p in layers)
    ):
        raise ValueError("SPAWN root needs layers: a non-empty list of absolute paths")
    if not isinstance(env, dict) or not all(
        isinstance(k, str) and k and "=" not in k and (v is None or isinstance(v, str))
        for k, v in env.items()
    ):
        raise ValueError("SPAWN root env must map variable names to strings or null")
    return {"layers": list(layers), "env": dict(env)}


def apply_root_env(root: dict[str, Any]) -> None:
    """The image's environment over the launch state's: set, or unset (None) each name."""
    for name, value in root["env"].items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


# --- the launcher's side (as root, before it drops to the dedicated uid) ----------------

_SYS_OPEN_TREE, _SYS_MOVE_MOUNT, _SYS_MOUNT_SETATTR = 428, 429, 442  # the same on every arch
_AT_FDCWD = -100
_AT_EMPTY_PATH = 0x1000
_AT_RECURSIVE = 0x8000
_OPEN_TREE_CLONE = 1
_O_CLOEXEC = 0o2000000
_MOVE_MOUNT_F_EMPTY_PATH = 4
_MOUNT_ATTR_RDONLY = 0x1
_MOUNT_ATTR_IDMAP = 0x00100000
_CLONE_NEWUSER = 0x10000000


class _MountAttr(ctypes.Structure):
    _fields_ = [
        ("attr_set", ctypes.c_uint64),
        ("attr_clr", ctypes.c_uint64),
        ("propagation", ctypes.c_uint64),
        ("userns_fd", ctypes.c_uint64),
    ]


def idmap_mounts(paths: Sequence[str], uid: int, gid: int) -> None:
    """Over each path, a read-only idmapped view in which files owned by 0 are ``uid``'s.

    Root pulled the image cache, so its files are root's; sessions run as the dedicated
    uid and map only that uid to 0, and overlayfs refuses to copy up a file whose owner
    is not mapped. Call in a private mount namespace (only the server sees the view).
    """
    userns = _userns_fd(uid, gid)
    lib = libc()
    try:
        for path in paths:
            tree = check(
                lib.syscall(
                    _SYS_OPEN_TREE,
                    _AT_FDCWD,
                    path.encode(),
                    _OPEN_TREE_CLONE | _O_CLOEXEC | _AT_RECURSIVE,
                ),
                f"open_tree({path!r})",
            )
            try:
                attr = _MountAttr(_MOUNT_ATTR_IDMAP | _MOUNT_ATTR_RDONLY, 0, 0, userns)
                check(
                    lib.syscall(
                        _SYS_MOUNT_SETATTR,
                        tree,
                        b"",
                        _AT_EMPTY_PATH,
                        ctypes.byref(attr),
                        ctypes.sizeof(attr),
                    ),
                    f"mount_setattr(idmap, {path!r})",
                )
                check(
                    lib.syscall(
                        _SYS_MOVE_MOUNT,
                        tree,
                        b"",
                        _AT_FDCWD,
                        path.encode(),
                        _MOVE_MOUNT_F_EMPTY_PATH,
                    ),
                    f"move_mount({path!r})",
                )
            finally:
                os.close(tree)
    finally:
        os.close(userns)


def _userns_fd(uid: int, gid: int) -> int:
    """A user namespace where 0 is ``uid``/``gid`` outside (held by a short-lived child)."""
    ready_r, ready_w = os.pipe()
    go_r, go_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover (the child)
        try:
            os.close(ready_r)
            os.close(go_w)
            if libc().unshare(_CLONE_NEWUSER) == 0:
                os.write(ready_w, b"1")
            os.read(go_r, 1)
        finally:
            os._exit(0)
    os.close(ready_w)
    os.close(go_r)
    try:
        if os.read(ready_r, 1) != b"1":
            raise SetupError("could not make a user namespace for the image cache's idmap")
        for name, text in (("uid_map", f"0 {uid} 1"), ("gid_map", f"0 {gid} 1")):
            with open(f"/proc/{pid}/{name}", "w", encoding="ascii") as fh:
                fh.write(text)
        return os.open(f"/proc/{pid}/ns/user", os.O_RDONLY | os.O_CLOEXEC)
    finally:
        os.close(ready_r)
        os.close(go_w)
        os.waitpid(pid, 0)
