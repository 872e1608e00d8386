"""The kernel calls every runtime process shares: prctl flags, rlimits, seccomp.

One copy of each, used by the launcher (before ``execve``), the fork server,
each session's confinement and the session worker. Failures raise
:class:`SetupError` with the call and the errno.
"""

from __future__ import annotations

import ctypes
import os
import resource

#: SIGKILL's number on Linux, spelled out: `signal` pulls in enum and functools,
#: about 3 ms of every launcher start.
SIGKILL = 9

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing costs milliseconds of start-up; annotations are strings here
    from collections.abc import Mapping
    from typing import Any

__all__ = [
    "RLIMITS",
    "SetupError",
    "apply_rlimits",
    "check",
    "die_with_parent",
    "libc",
    "load_seccomp",
    "mount",
    "set_no_new_privs",
    "set_subreaper",
]

# prctl options and seccomp constants (linux/prctl.h, linux/seccomp.h)
PR_SET_PDEATHSIG = 1
PR_SET_SECCOMP = 22
PR_SET_CHILD_SUBREAPER = 36
PR_SET_NO_NEW_PRIVS = 38
SECCOMP_MODE_FILTER = 2

RLIMITS = {
    "AS": resource.RLIMIT_AS,
    "CPU": resource.RLIMIT_CPU,
    "FSIZE": resource.RLIMIT_FSIZE,
    "NOFILE": resource.RLIMIT_NOFILE,
    "CORE": resource.RLIMIT_CORE,
    "NPROC": resource.RLIMIT_NPROC,
    "STACK": resource.RLIMIT_STACK,
}

_libc: Any = None


class SetupError(RuntimeError):
    """A process-level layer (prctl, rlimit, seccomp, mount...) could not be applied."""


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


def libc() -> Any:
    """The C library the process already maps (loaded once per process, inherited by forks)."""
    global _libc
    if _libc is None:
        lib = ctypes.CDLL(None, use_errno=True)
        lib.syscall.restype = ctypes.c_long
        lib.mount.argtypes = [
            ctypes.c_char_p,
            ctypes.c_char_p,
            ctypes.c_char_p,
            ctypes.c_ulong,
            ctypes.c_char_p,
        ]
        _libc = lib
    return _libc


def check(result: int, what: str) -> int:
    """``result`` of a libc call; :class:`SetupError` naming ``what`` when it failed."""
    if result < 0:
        err = ctypes.get_errno()
        raise SetupError(f"{what} failed: {os.strerror(err)} (errno {err})")
    return result


def mount(source: str, target: str, fstype: str | None, flags: int, data: str | None) -> None:
    """mount(2); :class:`SetupError` naming source and target when it fails."""
    result = libc().mount(
        source.encode(),
        target.encode(),
        None if fstype is None else fstype.encode(),
        ctypes.c_ulong(flags),
        None if data is None else data.encode(),
    )
    check(result, f"mount({source!r} on {target!r})")


def set_subreaper(on: bool) -> None:
    """Orphans of our descendants are re-parented to us (so a tree kill finds them)."""
    libc().prctl(PR_SET_CHILD_SUBREAPER, 1 if on else 0, 0, 0, 0)


def die_with_parent() -> None:
    """SIGKILL this process when its parent dies."""
    libc().prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0)


def set_no_new_privs() -> None:
    """``PR_SET_NO_NEW_PRIVS``: no setuid binary or file capability can raise privileges."""
    check(libc().prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "prctl(PR_SET_NO_NEW_PRIVS)")


def apply_rlimits(limits: Mapping[str, int | None]) -> None:
    """Set each limit (``None``: left alone) with hard = soft, so code cannot raise it again."""
    for name, value in limits.items():
        if value is None:
            continue
        try:
            resource.setrlimit(RLIMITS[name], (value, value))
        except (OSError, ValueError) as exc:
            raise SetupError(f"setrlimit({name}={value}) failed: {exc}") from exc


def load_seccomp(program: bytes) -> None:
    """Load a compiled BPF program (needs no_new_privs or CAP_SYS_ADMIN)."""
    buf = ctypes.create_string_buffer(program, len(program))
    prog = _SockFprog(len(program) // 8, ctypes.cast(buf, ctypes.c_void_p))
    check(
        libc().prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(prog), 0, 0),
        "prctl(PR_SET_SECCOMP)",
    )
