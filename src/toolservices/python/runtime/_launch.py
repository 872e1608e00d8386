"""Launcher: set up the process, drop privileges, then exec bwrap or the fork server.

Run as ``python -I -S runtime/_launch.py SPEC`` (SPEC: the hex of a
``marshal``-ed dict) by the command line that ``plan_server_launch``
returns; stdlib only, single-threaded, gone after one ``execve``. Doing
this work here rather than in a ``preexec_fn`` keeps the supervisor's fork
path trivial (it may have many threads) and lets root open
paths that the dedicated uid cannot reach before dropping to it.

Steps, each driven by the spec:

1. As root, paths the dedicated uid cannot traverse (typically an interpreter
   under ``/root``, mode 0700) are made reachable in a private mount
   namespace: a small tmpfs is mounted over the blocking ancestor and only the
   needed paths are bind-mounted back, read-only. The rest of that ancestor is
   hidden from the sandbox as a bonus.
2. ``setgroups([])`` and ``setresgid``/``setresuid`` to the dedicated uid.
3. Subreaper (so double-forked children stay below the server), rlimits
   (and the main thread's stack limit raised to its hard limit), no_new_privs.
4. seccomp: loaded here when bwrap is not used, otherwise written to a memfd
   whose number replaces ``@SECCOMP_FD@`` in bwrap's ``--seccomp`` argument.
5. ``execve`` of the final command with the allowlisted environment.

On any failure it prints one line prefixed ``toolservices-sandbox:`` to stderr
and exits with status 126.
"""

from __future__ import annotations

if __name__ == "__main__" and not __package__:  # started by path (the only way it runs)
    import sys  # (-I leaves the script's directory off sys.path)

    sys.path.insert(0, __file__.rpartition("/")[0])
    import _bootstrap  # noqa: F401

import marshal
import os
import resource
import sys

from ._linux import (
    PR_SET_CHILD_SUBREAPER,
    SetupError,
    apply_rlimits,
    check,
    libc,
    load_seccomp,
    set_no_new_privs,
)
from ._rootfs import idmap_mounts

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing costs milliseconds of start-up; annotations are strings here
    from typing import Any

_CLONE_NEWNS = 0x00020000
_MS_RDONLY = 1
_MS_NOSUID = 2
_MS_NODEV = 4
_MS_REMOUNT = 32
_MS_BIND = 4096
_MS_REC = 16384
_MS_PRIVATE = 1 << 18
SECCOMP_FD_PLACEHOLDER = "@SECCOMP_FD@"


class LaunchError(SetupError):
    pass


def _private_mounts() -> None:
    """A mount namespace of the server's own: what it mounts only it and its sessions see."""
    lib = libc()
    check(lib.unshare(_CLONE_NEWNS), "unshare(CLONE_NEWNS) for the server's own mounts")
    check(lib.mount(None, b"/", None, _MS_REC | _MS_PRIVATE, None), "make mounts private")


def _make_reachable(groups: list[dict[str, Any]]) -> None:
    """Mount a tmpfs over each blocking ancestor and bind the needed paths back (in the
    server's own mount namespace: :func:`_private_mounts` first)."""
    lib = libc()
    for group in groups:
        ancestor = group["ancestor"]
        # Open the needed paths in this namespace before they are covered.
        fds = [(os.open(item["path"], os.O_PATH | os.O_CLOEXEC), item) for item in group["paths"]]
        check(
            lib.mount(
                b"tmpfs", ancestor.encode(), b"tmpfs", _MS_NOSUID | _MS_NODEV, b"mode=0755,size=1m"
            ),
            f"tmpfs over {ancestor}",
        )
        for fd, item in fds:
            path = item["path"]
            if item["is_dir"]:
                os.makedirs(path, mode=0o755, exist_ok=True)
            else:
                os.makedirs(os.path.dirname(path), mode=0o755, exist_ok=True)
                os.close(os.open(path, os.O_CREAT | os.O_WRONLY | os.O_CLOEXEC, 0o644))
            source = f"/proc/self/fd/{fd}".encode()
            check(lib.mount(source, path.encode(), None, _MS_BIND | _MS_REC, None), f"bind {path}")
            if item["ro"]:
                flags = _MS_BIND | _MS_REMOUNT | _MS_RDONLY | _MS_NOSUID | _MS_NODEV
                check(
                    lib.mount(None, path.encode(), None, flags, None), f"remount {path} read-only"
                )
            os.close(fd)


def _drop(uid: int, gid: int) -> None:
    os.setgroups([])
    os.setresgid(gid, gid, gid)
    os.setresuid(uid, uid, uid)
    if os.getresuid() != (uid, uid, uid) or os.getresgid() != (gid, gid, gid):
        raise LaunchError(f"uid drop to {uid}:{gid} did not hold")


def _seccomp_memfd(program: bytes) -> int:
    fd = os.memfd_create("toolservices-seccomp", 0)  # inheritable by bwrap
    os.write(fd, program)
    os.lseek(fd, 0, os.SEEK_SET)
    return fd


def _raise_stack_limit() -> None:
    """Room for the main thread's stack, whatever ``stack_size`` the sessions get.

    The soft limit goes up to the hard one (normally unlimited), before
    ``execve``, so that the kernel lays out the server's address space for it;
    each session then sets its own ``RLIMIT_STACK`` (``SandboxConfig.stack_size``,
    none with ``None``). The stack is reserved only as it is used, so
    ``RLIMIT_AS`` counts just what a recursion touches. With an unlimited stack
    glibc gives threads 2 MiB stacks by default; the server sets 8 MiB
    for its own threads, each session ``THREAD_STACK`` (``_worker``).
    """
    soft, hard = resource.getrlimit(resource.RLIMIT_STACK)
    if soft != hard:
        resource.setrlimit(resource.RLIMIT_STACK, (hard, hard))


def launch(spec: dict[str, Any]) -> None:
    as_uid = spec.get("uid") is not None
    idmap = spec.get("idmap") if as_uid else None
    optional = spec.get("idmap_optional") if as_uid else None
    if spec.get("reach") or idmap or optional:
        _private_mounts()
    if spec.get("reach"):
        _make_reachable(spec["reach"])
    if idmap:
        idmap_mounts(idmap, spec["uid"], spec["gid"])
    for path in optional or ():  # sessions on other images only: the server runs without
        try:
            idmap_mounts([path], spec["uid"], spec["gid"])
        except (SetupError, OSError) as exc:
            sys.stderr.write(
                f"toolservices-sandbox: no idmapped view of {path} ({exc}): sessions on "
                "another image than the service's cannot start\n"
            )
    if spec.get("uid") is not None:
        _drop(spec["uid"], spec["gid"])
    if spec.get("subreaper"):
        check(libc().prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0), "prctl(PR_SET_CHILD_SUBREAPER)")
    apply_rlimits(spec.get("rlimits", {}))
    _raise_stack_limit()
    if spec.get("no_new_privs"):
        set_no_new_privs()
    argv = list(spec["argv"])
    seccomp = spec.get("seccomp")
    if seccomp is not None:
        program = bytes.fromhex(seccomp["program"])
        if seccomp["mode"] == "bwrap":
            fd = _seccomp_memfd(program)
            argv = [str(fd) if arg == SECCOMP_FD_PLACEHOLDER else arg for arg in argv]
        else:
            load_seccomp(program)
    os.execve(argv[0], argv, spec["env"])


def main() -> None:
    try:
        # marshal is built in (json would cost ~15 ms of imports); same interpreter both sides
        launch(marshal.loads(bytes.fromhex(sys.argv[1])))
    except (SetupError, OSError, ValueError, EOFError, TypeError, KeyError, IndexError) as exc:
        sys.stderr.write(f"toolservices-sandbox: launch failed: {exc}\n")
        sys.stderr.flush()
        os._exit(126)


if __name__ == "__main__":
    main()
