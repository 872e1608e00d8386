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

import os
from collections.abc import Sequence

from ._linux import SetupError, check, libc, mount

__all__ = ["MAX_OVERLAY_OPTIONS", "enter_image_root", "overlay_options"]

MAX_OVERLAY_OPTIONS = 4095
_MS_BIND = 4096
_MS_REC = 16384
_MS_RDONLY = 1
_MS_REMOUNT = 32
_MNT_DETACH = 2
# pivot_root has no libc wrapper: its syscall number (asm/unistd.h) by architecture.
_SYS_PIVOT_ROOT = {"x86_64": 155, "aarch64": 41, "riscv64": 41, "ppc64le": 203, "s390x": 217}
_OLD = ".toolservices-old-root"


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
    bound at the same path inside, recursively, made when the image lacks it.
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
        if os.path.isdir(path):
            os.makedirs(inside, 0o755, exist_ok=True)
        else:
            os.makedirs(os.path.dirname(inside), 0o755, exist_ok=True)
            if not os.path.exists(inside):
                os.close(os.open(inside, os.O_CREAT | os.O_WRONLY | os.O_CLOEXEC, 0o644))
        mount(path, inside, None, _MS_BIND | _MS_REC, None)
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
