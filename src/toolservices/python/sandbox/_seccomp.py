"""Build the sandbox's seccomp filter as raw BPF bytes (parent side).

The filter is compiled once with ``pyseccomp`` (which uses the system
``libseccomp``) in the supervising process and handed over as bytes: to
bubblewrap through ``--seccomp FD``, or to the launcher, which loads it with
one ``prctl``. Neither the sandboxed interpreter nor the fork server needs
``pyseccomp`` itself.

The filter is a deny list on top of "allow": it removes kernel surface that
model-written code never needs (namespaces, mounts, tracing, BPF, io_uring,
keyrings, terminal injection) and every socket family but an allowlist
(:func:`allowed_socket_families`: ``AF_UNIX``, plus IP when the network
mode lets sessions use it).
"""

from __future__ import annotations

import errno
import functools
import os

from toolservices.python.sandbox._network import allowed_socket_families, network_mode

__all__ = ["SeccompUnavailable", "build_filter"]

# Syscalls that fail with EPERM. Names unknown to this kernel's libseccomp
# table are skipped (older architectures lack some of them).
_DENY_EPERM = (
    "ptrace",
    "process_vm_readv",
    "process_vm_writev",
    "kcmp",
    "mount",
    "umount2",
    "pivot_root",
    "move_mount",
    "open_tree",
    "fsopen",
    "fsmount",
    "fsconfig",
    "fspick",
    "mount_setattr",
    "unshare",
    "setns",
    "keyctl",
    "add_key",
    "request_key",
    "bpf",
    "perf_event_open",
    "userfaultfd",
    "io_uring_setup",
    "io_uring_enter",
    "io_uring_register",
    "kexec_load",
    "kexec_file_load",
    "init_module",
    "finit_module",
    "delete_module",
    "swapon",
    "swapoff",
    "reboot",
    "acct",
    "quotactl",
    "name_to_handle_at",
    "open_by_handle_at",
    "lookup_dcookie",
    "fanotify_init",
    "syslog",
)

#: families above every one the kernel knows (AF_MAX is 46 in Linux 6.x): all refused
_FAMILY_CEILING = 64

_CLONE_NEWUSER = 0x10000000
_TIOCSTI = 0x5412
_TIOCLINUX = 0x541C


class SeccompUnavailable(RuntimeError):
    """pyseccomp or the system libseccomp cannot be used; the message says why."""


@functools.lru_cache(maxsize=4)
def build_filter(*, network: bool | str) -> bytes:
    """Return the compiled BPF program (``struct sock_filter`` array) for the sandbox.

    Raises :class:`SeccompUnavailable` with the reason when it cannot be built.
    """
    try:
        import pyseccomp as sc
    except (ImportError, OSError) as exc:  # OSError: libseccomp.so.2 missing
        raise SeccompUnavailable(f"pyseccomp/libseccomp not importable: {exc}") from exc
    try:
        flt = sc.SyscallFilter(sc.ALLOW)
        for name in _DENY_EPERM:
            try:
                flt.add_rule(sc.ERRNO(errno.EPERM), name)
            except (OSError, ValueError):  # unknown on this arch or libseccomp version
                continue
        # New user namespaces are how most container escapes start.
        flt.add_rule(
            sc.ERRNO(errno.EPERM),
            "clone",
            sc.Arg(0, sc.MASKED_EQ, _CLONE_NEWUSER, _CLONE_NEWUSER),
        )
        # clone3 passes flags in memory, which BPF cannot inspect: ENOSYS makes
        # glibc fall back to clone(), where the rule above applies.
        flt.add_rule(sc.ERRNO(errno.ENOSYS), "clone3")
        for request in (_TIOCSTI, _TIOCLINUX):
            flt.add_rule(
                sc.ERRNO(errno.EPERM), "ioctl", sc.Arg(1, sc.MASKED_EQ, 0xFFFFFFFF, request)
            )
        # an allowlist of families, written as denials: each other family by its low 32 bits
        # (the kernel reads an int), and any value at or above the ceiling (high bits too)
        allowed = allowed_socket_families(network_mode(network))
        for call in ("socket", "socketpair"):
            for family in range(_FAMILY_CEILING):
                if family not in allowed:
                    flt.add_rule(
                        sc.ERRNO(errno.EAFNOSUPPORT),
                        call,
                        sc.Arg(0, sc.MASKED_EQ, 0xFFFFFFFF, family),
                    )
            flt.add_rule(sc.ERRNO(errno.EAFNOSUPPORT), call, sc.Arg(0, sc.GE, _FAMILY_CEILING))
        fd = os.memfd_create("toolservices-seccomp", os.MFD_CLOEXEC)
        try:
            with os.fdopen(os.dup(fd), "rb", closefd=True) as reader:
                flt.export_bpf(reader)
            os.lseek(fd, 0, os.SEEK_SET)
            chunks = []
            while chunk := os.read(fd, 65536):
                chunks.append(chunk)
        finally:
            os.close(fd)
    except OSError as exc:
        raise SeccompUnavailable(f"libseccomp failed to build the filter: {exc}") from exc
    program = b"".join(chunks)
    if not program or len(program) % 8:
        raise SeccompUnavailable(f"libseccomp exported a malformed program ({len(program)} bytes)")
    return program
