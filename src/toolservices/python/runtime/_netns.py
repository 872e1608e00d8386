"""A session's own network namespace with only ``lo`` up (``network="loopback"``).

Kept apart from the rest of the session set-up so it stays one call there:
:func:`loopback_flags` (added to the session's ``unshare``) and
:func:`bring_loopback_up` (after the uid map, while the namespace's
capabilities are still held). Standard library only (``ctypes``): the
session does not import ``socket`` for it.
"""

from __future__ import annotations

import ctypes

from ._linux import check, libc

__all__ = ["CLONE_NEWNET", "bring_loopback_up", "loopback_flags"]

CLONE_NEWNET = 0x40000000
_AF_INET = 2
_SOCK_DGRAM = 2
_SOCK_CLOEXEC = 0o2000000
_SIOCGIFFLAGS = 0x8913
_SIOCSIFFLAGS = 0x8914
_IFF_UP = 0x1


class _IfReq(ctypes.Structure):
    _fields_ = [
        ("name", ctypes.c_char * 16),
        ("flags", ctypes.c_short),
        ("pad", ctypes.c_byte * 22),
    ]


def loopback_flags(loopback: bool) -> int:
    """The ``unshare`` flag a session adds for ``network="loopback"`` (0 otherwise)."""
    return CLONE_NEWNET if loopback else 0


def bring_loopback_up() -> None:
    """Set ``lo`` up in the (new, empty) network namespace of this process."""
    lib = libc()
    fd = check(lib.socket(_AF_INET, _SOCK_DGRAM | _SOCK_CLOEXEC, 0), "socket (for lo)")
    try:
        request = _IfReq(name=b"lo")
        check(lib.ioctl(fd, _SIOCGIFFLAGS, ctypes.byref(request)), "ioctl(SIOCGIFFLAGS, lo)")
        request.flags |= _IFF_UP
        check(lib.ioctl(fd, _SIOCSIFFLAGS, ctypes.byref(request)), "ioctl(SIOCSIFFLAGS, lo)")
    finally:
        lib.close(fd)
