"""What a freshly forked session process applies to itself before user code.

Runtime side: it runs in the fork server and the processes it forks (the
sessions, the probe's and the snippet runner's), importing only the standard
library. ``plan_server_launch`` serialises everything a session needs
(rlimits, Landlock paths, whether seccomp is still to be applied) into the
server's environment under ``TOOLSERVICES_SANDBOX_STATE``; :func:`enter_session`
reads it once per server and removes it from the session's environment.

Every layer the state asks for is applied or the call raises
:class:`SessionSetupError`: a session never runs with fewer layers than the
report promised.
"""

from __future__ import annotations

import ctypes
import errno
import json
import os
import stat
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

from ._linux import (
    SetupError,
    apply_rlimits,
    check,
    die_with_parent,
    libc,
    load_seccomp,
    mount,
    set_no_new_privs,
    set_subreaper,
)
from ._netns import bring_loopback_up, loopback_flags
from ._rootfs import apply_root_env, enter_session_root, root_landlock_paths, upper_of
from ._seed import copy_into, open_seed

__all__ = [
    "STATE_ENV",
    "SessionSetupError",
    "enter_copy",
    "enter_session",
    "fixed_workspace",
    "landlock_abi",
    "fork_confined",
    "own_pids",
    "last_enter_seconds",
    "remove_tree",
]

STATE_ENV = "TOOLSERVICES_SANDBOX_STATE"

# Namespaces and mounts (linux/sched.h, linux/mount.h, linux/capability.h).
_CLONE_NEWNS = 0x00020000
_CLONE_NEWCGROUP = 0x02000000
_CLONE_NEWPID = 0x20000000
_CLONE_NEWIPC = 0x08000000
_CLONE_NEWUSER = 0x10000000
_MS_NOSUID = 2
_MS_NODEV = 4
_MS_NOEXEC = 8
_MS_BIND = 4096
_MS_REC = 16384
_MS_PRIVATE = 1 << 18
_CAP_VERSION_3 = 0x20080522
#: what a session gets of its own with ``session_ns`` (see enter_session_namespaces)
SESSION_TMPFS = ("/tmp", "/dev/shm")
#: per-session budgets of the kernel's per-user counters (``/proc/sys/user``), which every
#: session would otherwise share (one uid): one session holding every inotify instance
#: (128 by default, for the uid that owns the sessions' namespaces) leaves the others none
SESSION_USER_LIMITS = {"max_inotify_instances": 16, "max_inotify_watches": 16384}

# Landlock (linux/landlock.h); syscall numbers are the same on every 64-bit arch.
_SYS_LANDLOCK_CREATE_RULESET = 444
_SYS_LANDLOCK_ADD_RULE = 445
_SYS_LANDLOCK_RESTRICT_SELF = 446
_LANDLOCK_CREATE_RULESET_VERSION = 1
_LANDLOCK_RULE_PATH_BENEATH = 1
_FS_EXECUTE = 1 << 0
_FS_WRITE_FILE = 1 << 1
_FS_READ_FILE = 1 << 2
_FS_READ_DIR = 1 << 3
_FS_ABI1_ALL = (1 << 13) - 1  # EXECUTE .. MAKE_SYM
_FS_REFER = 1 << 13  # ABI 2
_FS_TRUNCATE = 1 << 14  # ABI 3
_FS_IOCTL_DEV = 1 << 15  # ABI 5
_NET_BIND_TCP = 1 << 0  # ABI 4
_NET_CONNECT_TCP = 1 << 1
_SCOPE_ABSTRACT_UNIX_SOCKET = 1 << 0  # ABI 6
_SCOPE_SIGNAL = 1 << 1
# Rights that make sense on a non-directory inode.
_FILE_RIGHTS = _FS_EXECUTE | _FS_WRITE_FILE | _FS_READ_FILE | _FS_TRUNCATE | _FS_IOCTL_DEV

#: a sandbox layer that the launch report promised could not be applied
SessionSetupError = SetupError
_state_cache: dict[str, Any] | None = None
last_enter_seconds: float = 0.0
"""Duration of the last :func:`enter_session` call in this process (for benchmarks)."""
#: with ``own_pids``: where the intermediate process writes the pid (as the parent sees it)
#: of the session it forked as the first process of its new PID namespace (fork_confined)
_pid_report_fd: int | None = None


class _RulesetAttr(ctypes.Structure):
    _fields_ = [
        ("handled_access_fs", ctypes.c_uint64),
        ("handled_access_net", ctypes.c_uint64),
        ("scoped", ctypes.c_uint64),
    ]


class _PathBeneathAttr(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [
        ("effective", ctypes.c_uint32),
        ("permitted", ctypes.c_uint32),
        ("inheritable", ctypes.c_uint32),
    ]


def landlock_abi() -> int:
    """The kernel's Landlock ABI version, or 0 when Landlock is absent or disabled."""
    lib = libc()
    result = lib.syscall(_SYS_LANDLOCK_CREATE_RULESET, None, 0, _LANDLOCK_CREATE_RULESET_VERSION)
    return int(result) if result > 0 else 0


def _fs_rights(abi: int) -> int:
    rights = _FS_ABI1_ALL
    if abi >= 2:
        rights |= _FS_REFER
    if abi >= 3:
        rights |= _FS_TRUNCATE
    if abi >= 5:
        rights |= _FS_IOCTL_DEV
    return rights


def apply_landlock(
    *,
    read: Sequence[str],
    write: Sequence[str],
    devices: Sequence[str],
    deny_tcp: bool,
    scope: bool,
    abi: int | None = None,
) -> int:
    """Restrict this process (and its future children) with Landlock; return the ABI used.

    ``read`` paths get read and execute rights, ``write`` paths every right,
    ``devices`` read/write/ioctl on the device files themselves; everything
    else on the filesystem is denied. With ``deny_tcp`` (ABI >= 4) TCP bind
    and connect are denied; with ``scope`` (ABI >= 6) signals and abstract
    unix sockets cannot reach processes outside this domain.
    """
    abi = landlock_abi() if abi is None else abi
    if abi < 1:
        raise SessionSetupError("Landlock is not available in this kernel")
    handled = _fs_rights(abi)
    attr = _RulesetAttr(handled, 0, 0)
    size = 8
    if abi >= 4:
        size = 16
        if deny_tcp:
            attr.handled_access_net = _NET_BIND_TCP | _NET_CONNECT_TCP
    if abi >= 6:
        size = 24
        if scope:
            attr.scoped = _SCOPE_ABSTRACT_UNIX_SOCKET | _SCOPE_SIGNAL
    lib = libc()
    ruleset = check(
        lib.syscall(_SYS_LANDLOCK_CREATE_RULESET, ctypes.byref(attr), size, 0),
        "landlock_create_ruleset",
    )
    try:
        read_rights = _FS_EXECUTE | _FS_READ_FILE | _FS_READ_DIR
        device_rights = (_FS_READ_FILE | _FS_WRITE_FILE | _FS_TRUNCATE | _FS_IOCTL_DEV) & handled
        for paths, rights in ((read, read_rights), (write, handled), (devices, device_rights)):
            for path in paths:
                _add_path_rule(lib, ruleset, path, rights)
        check(lib.syscall(_SYS_LANDLOCK_RESTRICT_SELF, ruleset, 0), "landlock_restrict_self")
    finally:
        os.close(ruleset)
    return abi


def _add_path_rule(lib: Any, ruleset: int, path: str, rights: int) -> None:
    try:
        fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
    except FileNotFoundError:
        return  # an optional path (e.g. /lib32) that this system lacks
    except OSError as exc:
        raise SessionSetupError(f"Landlock cannot open {path!r}: {exc}") from exc
    try:
        if not stat.S_ISDIR(os.fstat(fd).st_mode):
            rights &= _FILE_RIGHTS
        rule = _PathBeneathAttr(rights, fd)
        check(
            lib.syscall(
                _SYS_LANDLOCK_ADD_RULE, ruleset, _LANDLOCK_RULE_PATH_BENEATH, ctypes.byref(rule), 0
            ),
            f"landlock_add_rule({path!r})",
        )
    finally:
        os.close(fd)


_mount = mount


def enter_session_namespaces(
    *,
    lineage: str,
    tmp_size: int,
    keep: Sequence[str] = (),
    disk_quota: int | None = None,
    workspace: str | None = None,
    home: str | None = None,
    own_pids: bool = False,
    loopback: bool = False,
    root: Sequence[str] = (),
    upper_seed: int | None = None,
) -> None:
    """Give this (single-threaded, just forked) session namespaces of its own.

    A user namespace (mapping only our uid and gid) makes the kernel count
    ``RLIMIT_NPROC`` per session: tasks are counted per uid *and* user
    namespace, so each session gets its own process budget, independent of
    the other sessions and of the caller's processes. In it, a mount
    namespace gets fresh size-capped tmpfs mounts on ``/tmp`` and
    ``/dev/shm`` (a session's files there are gone when it ends, and no other
    session sees them), and an IPC namespace keeps SysV shared memory and
    semaphores private. What must stay visible below them (the session's own
    directory, read-only paths such as a virtualenv under ``/tmp``) is bound
    back on top. With ``disk_quota`` the lineage directory itself becomes a
    tmpfs of that size (its files live and die with this mount namespace).
    With ``workspace`` the session's own directory ``home`` (in the lineage)
    is also bound on that fixed path, the same in every session.
    The user namespace's own budgets for the per-user kernel counters
    (:data:`SESSION_USER_LIMITS`: inotify instances and watches) keep one
    session from taking all of them.
    With ``own_pids`` the session also gets PID and cgroup namespaces: this
    process forks the session proper as the first process (pid 1) of the new
    PID namespace, with a ``/proc`` of its own, and exits (see
    :func:`_become_pid_one`).
    The capabilities the new namespace grants are dropped before
    user code runs (seccomp and Landlock, applied after this, deny mounts and
    new namespaces anyway).
    """
    uid, gid = os.getuid(), os.getgid()
    lib = libc()
    flags = _CLONE_NEWUSER | _CLONE_NEWNS | _CLONE_NEWIPC | loopback_flags(loopback)
    if own_pids:
        flags |= _CLONE_NEWPID | _CLONE_NEWCGROUP
    check(
        lib.unshare(flags),
        "unshare(user, mnt, ipc" + (", pid, cgroup" if own_pids else "") + "[, net])",
    )
    inside = (0, 0) if root else (uid, gid)  # an image's root user is the session's uid
    maps = (
        ("setgroups", "deny"),
        ("uid_map", f"{inside[0]} {uid} 1"),
        ("gid_map", f"{inside[1]} {gid} 1"),
    )
    for name, text in maps:
        with open(f"/proc/self/{name}", "w", encoding="ascii") as fh:
            fh.write(text)
    if loopback:
        bring_loopback_up()
    _mount("none", "/", None, _MS_REC | _MS_PRIVATE, None)
    if disk_quota:
        _mount("tmpfs", lineage, "tmpfs", _MS_NOSUID | _MS_NODEV, f"size={disk_quota},mode=0700")
    for target in SESSION_TMPFS:
        if not os.path.isdir(target):
            continue
        prefix = target.rstrip("/") + "/"
        below = [p for p in (lineage, *keep) if p.startswith(prefix) and os.path.exists(p)]
        held = [(p, os.open(p, os.O_PATH | os.O_CLOEXEC)) for p in below]
        try:
            _mount("tmpfs", target, "tmpfs", _MS_NOSUID | _MS_NODEV, f"size={tmp_size},mode=1777")
            for path, fd in held:
                if stat.S_ISDIR(os.fstat(fd).st_mode):
                    os.makedirs(path, mode=0o755, exist_ok=True)
                else:
                    os.makedirs(os.path.dirname(path), mode=0o755, exist_ok=True)
                    os.close(os.open(path, os.O_CREAT | os.O_WRONLY | os.O_CLOEXEC, 0o600))
                _mount(f"/proc/self/fd/{fd}", path, None, _MS_BIND | _MS_REC, None)
        finally:
            for _path, fd in held:
                os.close(fd)
    if workspace:
        own = home or lineage
        os.makedirs(own, 0o700, exist_ok=True)  # on the quota's tmpfs when there is one
        os.makedirs(workspace, 0o755, exist_ok=True)  # L3: bubblewrap made it; L2: in /tmp
        _mount(own, workspace, None, _MS_BIND, None)
    if own_pids:
        _become_pid_one()
    for name, value in SESSION_USER_LIMITS.items():  # this user namespace's own
        try:
            with open(f"/proc/sys/user/{name}", "w", encoding="ascii") as fh:
                fh.write(str(value))
        except FileNotFoundError:  # a kernel without this counter: nothing to share
            continue
    # after the PID namespace: the image root binds this session's own /proc
    if root:
        binds = [*SESSION_TMPFS, *([workspace] if workspace else [])]
        enter_session_root(root, lineage=lineage, binds=binds, upper_seed=upper_seed)
    header, data = _CapHeader(_CAP_VERSION_3, 0), (_CapData * 2)()
    check(lib.capset(ctypes.byref(header), data), "capset (dropping capabilities)")
    die_with_parent()  # kept across the change; be sure


def _become_pid_one() -> None:
    """Fork the session as pid 1 of the PID namespace just made; this process exits.

    ``unshare(CLONE_NEWPID)`` moves only our future children: the child is the
    session. It tells the parent (``fork_confined``, a subreaper) its pid
    through ``_pid_report_fd`` and, once re-parented to it, mounts a ``/proc``
    that shows only its own namespace: the processes of other sessions and of
    the fork server can neither be seen nor named (no ``kill``, ``prlimit``,
    ``setpriority``, ``sched_setaffinity`` on them), and they die with it.
    """
    global _pid_report_fd
    report = _pid_report_fd
    if report is None:
        raise SessionSetupError("a session with its own PID namespace is made by fork_confined")
    middle = os.getpid()
    gone_r, gone_w = os.pipe2(os.O_CLOEXEC)  # end of file: the middle process is exiting
    pid = os.fork()
    if pid:
        os.write(report, str(pid).encode())
        os._exit(0)
    os.close(report)
    os.close(gone_w)
    _pid_report_fd = None
    os.setsid()
    os.read(gone_r, 1)  # asleep, not spinning, while the middle process runs and exits
    os.close(gone_r)
    # the parent's /proc still shows us: wait (microseconds: its descriptors are closed just
    # before it is reaped) until we are the subreaper's child, so that die_with_parent()
    # names the right one
    deadline = time.monotonic() + 5.0
    while _outer_ppid() == middle:
        if time.monotonic() > deadline:
            raise SessionSetupError("the session's intermediate process did not exit")
        os.sched_yield()
    _mount("proc", "/proc", "proc", _MS_NOSUID | _MS_NODEV | _MS_NOEXEC, None)


def _outer_ppid() -> int:
    """Our parent's pid as the parent namespace's ``/proc`` (still mounted) shows it."""
    with open("/proc/self/stat", "rb") as fh:
        return int(fh.read().rsplit(b")", 1)[1].split()[1])


def enter_copy(workdir: str) -> None:
    """Confine a copy made by ``fork_session`` to its own directory (a stacked Landlock layer).

    A copy shares its source's namespaces (a locked-down process cannot make
    new ones): its own writes go only to its working directory, so copies
    cannot write into each other's directories, nor into the ``/tmp`` and
    ``/dev/shm`` of their lineage (which they can still read: what the
    source left there before the fork). Without Landlock nothing is added.
    """
    state = _load_state()
    landlock = None if state is None else state.get("landlock")
    if landlock is None:
        return
    extra = [path for path in SESSION_TMPFS if state and state.get("session_ns")]
    apply_landlock(
        read=[*landlock["read"], *extra, *landlock["write"]],
        write=[workdir],
        devices=landlock["devices"],
        deny_tcp=landlock["deny_tcp"],
        scope=landlock["scope"],
        abi=landlock["abi"],
    )


def uid_tasks(uid: int) -> int:
    """Tasks (threads included) of ``uid`` among the processes this /proc shows.

    One ``stat`` per process plus one read per matching process: a few hundred
    microseconds inside a PID namespace, a few milliseconds on a busy host.
    """
    total = 0
    with os.scandir("/proc") as entries:
        for entry in entries:
            if not entry.name.isdigit():
                continue
            try:
                if entry.stat(follow_symlinks=False).st_uid != uid:
                    continue
                with open(f"/proc/{entry.name}/stat", "rb") as fh:
                    fields = fh.read().rsplit(b")", 1)[1].split()
                total += int(fields[17])  # field 20, num_threads
            except (OSError, ValueError, IndexError):
                continue  # exited meanwhile
    return total


def _load_state() -> dict[str, Any] | None:
    global _state_cache
    if _state_cache is None:
        raw = os.environ.get(STATE_ENV)
        if raw is None:
            return None
        _state_cache = json.loads(raw)
    return _state_cache


def fixed_workspace(state: dict[str, Any] | None = None) -> str | None:
    """The fixed path every session's directory is bound on, or None (each has its own path)."""
    state = _load_state() if state is None else state
    session_ns = None if state is None else state.get("session_ns")
    return session_ns.get("workspace") if session_ns else None


def image_layers(state: dict[str, Any] | None, root: dict[str, Any] | None) -> list[str]:
    """The layers (top first) of a session's image root: ``root``'s (a SPAWN request's),
    else the launch state's; empty for the host view. SessionSetupError when there is an
    image but no session namespaces to stack it in."""
    session_ns = (state or {}).get("session_ns") or {}
    if root is None:
        return list(session_ns.get("root") or ())
    if not session_ns:
        raise SessionSetupError("a session on an image needs session namespaces")
    return list(root["layers"])


def own_pids(state: dict[str, Any] | None = None) -> bool:
    """Whether every session has a PID namespace of its own (``SandboxConfig.own_pids``)."""
    state = _load_state() if state is None else state
    session_ns = None if state is None else state.get("session_ns")
    return bool(session_ns and session_ns.get("own_pids"))


def enter_session(
    state: dict[str, Any] | None = None,
    *,
    workdir: str,
    home: str | None = None,
    seed_fd: int | None = None,
    upper_seed: int | None = None,
    root: dict[str, Any] | None = None,
) -> str:
    """Confine the calling process (a freshly forked session) before it runs user code.

    In order: own session (``setsid``), namespaces, the seed copy (``seed_fd``:
    a directory whose tree becomes the session's files, see ``_seed``),
    no_new_privs, rlimits with hard = soft, the working directory and
    ``HOME``/``TMPDIR``, Landlock (writes only in the workdir and the private
    ``/tmp``, ``/dev/shm``; TCP and signal scoping), and seccomp when the
    launcher could not apply it. ``workdir`` is the directory the session may
    write (its lineage), ``home`` its own directory in it (``workdir`` by
    default); returns where it works: ``home``, or the fixed workspace path
    that shows it. ``root``: an image for this session instead of the launch
    state's (a SPAWN request's, see ``_protocol.Spawn``). The layer
    list comes from the server's launch state; ``state`` is only needed when
    the server was not started through ``plan_server_launch`` (the sandbox's
    ``enter_session`` builds it from a ``SandboxConfig``).
    """
    global last_enter_seconds
    started = time.perf_counter()
    env_state = _load_state()
    if env_state is not None:
        state = env_state
    if state is None:
        raise SessionSetupError(
            f"no {STATE_ENV} in the environment: start the server with plan_server_launch() "
            "or pass a SandboxConfig"
        )
    os.environ.pop(STATE_ENV, None)
    if os.getsid(0) != os.getpid():
        try:
            os.setsid()
        except PermissionError:  # already a process-group leader: keep its group
            pass
    session_ns = state.get("session_ns")
    own = home or workdir
    fixed = fixed_workspace(state)
    layers = image_layers(state, root)
    if root is not None:
        apply_root_env(root)
    if session_ns:  # before the rlimits: a new user namespace starts its own NPROC count
        enter_session_namespaces(
            lineage=workdir,
            tmp_size=session_ns["tmp_size"],
            keep=session_ns.get("keep", ()),
            disk_quota=session_ns.get("disk_quota"),
            workspace=fixed,
            home=own,
            own_pids=own_pids(state),
            loopback=bool(session_ns.get("loopback")),
            root=layers,
            upper_seed=upper_seed,
        )
    where = fixed or own
    try:
        os.makedirs(own, 0o700, exist_ok=True)  # hidden by a disk_quota mount on the lineage
    except OSError as exc:
        raise SessionSetupError(f"cannot make the session workdir {own!r}: {exc}") from exc
    if seed_fd is not None:  # capabilities dropped already; Landlock would deny the source
        copy_into(seed_fd, where)
    set_no_new_privs()
    limits = dict(state["rlimits"])
    headroom = state.get("nproc_headroom")
    if headroom is not None and session_ns:
        limits["NPROC"] = headroom + 1  # this process is the first task of its namespace
    elif headroom is not None:
        # RLIMIT_NPROC counts every task of this uid: allow `headroom` more than exist now
        # (plus those hidden from this /proc, e.g. the caller's own outside a PID namespace).
        limits["NPROC"] = state.get("nproc_hidden", 0) + uid_tasks(os.getuid()) + headroom
    apply_rlimits(limits)
    try:
        os.chdir(where)
    except OSError as exc:
        raise SessionSetupError(f"cannot enter the session workdir {where!r}: {exc}") from exc
    os.environ["HOME"] = os.environ["TMPDIR"] = os.environ["PWD"] = where
    tempfile_module = sys.modules.get("tempfile")
    if tempfile_module is not None:  # the server may have cached its own temp dir
        tempfile_module.tempdir = None  # type: ignore[attr-defined]
    landlock = state.get("landlock")
    if landlock is not None:
        own_tmp = [p for p in SESSION_TMPFS if session_ns and p not in landlock["write"]]
        read, write = landlock["read"], landlock["write"]
        if session_ns and layers:
            read, write = root_landlock_paths(own_pids(state))
        apply_landlock(
            read=read,
            write=[workdir, *([fixed] if fixed else []), *write, *own_tmp],
            devices=landlock["devices"],
            deny_tcp=landlock["deny_tcp"],
            scope=landlock["scope"],
            abi=landlock["abi"],
        )
    program = state.get("seccomp_program")
    if program is not None:
        load_seccomp(bytes.fromhex(program))
    last_enter_seconds = time.perf_counter() - started
    return where


def remove_tree(path: str) -> None:
    """Delete a directory tree iteratively, never following symlinks.

    Safe against deep trees (no recursion), symlinks planted by user code and
    mode-000 directories (each directory is made writable by its owner before
    it is emptied). Missing paths are fine.
    """
    try:
        top = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        return
    except OSError as exc:
        if exc.errno not in (errno.ENOTDIR, errno.ELOOP):
            raise
        os.unlink(path)  # a file or a symlink: remove the link, never its target
        return
    # Stack of (directory fd, name of this dir inside its parent or None for the top).
    stack: list[tuple[int, str | None]] = [(top, None)]
    while stack:
        dfd, _name = stack[-1]
        descended = False
        with os.scandir(dfd) as entries:
            names = [entry.name for entry in entries]
        for entry_name in names:
            try:
                st = os.lstat(entry_name, dir_fd=dfd)
            except FileNotFoundError:
                continue
            if stat.S_ISDIR(st.st_mode):
                try:
                    os.rmdir(entry_name, dir_fd=dfd)
                    continue
                except OSError as exc:
                    if exc.errno not in (errno.ENOTEMPTY, errno.EEXIST, errno.EACCES):
                        raise
                try:
                    os.chmod(entry_name, 0o700, dir_fd=dfd, follow_symlinks=False)
                except (NotImplementedError, OSError):
                    pass  # best effort: the open below reports a real problem
                child = os.open(
                    entry_name,
                    os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC,
                    dir_fd=dfd,
                )
                stack.append((child, entry_name))
                descended = True
                break
            os.unlink(entry_name, dir_fd=dfd)
        if descended:
            continue
        stack.pop()
        os.close(dfd)
        if stack and _name is not None:
            os.rmdir(_name, dir_fd=stack[-1][0])
    os.rmdir(path)


def fork_confined(
    workdir: str,
    *,
    lineage: str | None = None,
    prepare: Callable[[], None] | None = None,
    failed: Callable[[BaseException], None] | None = None,
    seed: tuple[str, list[int]] | None = None,
    root: dict[str, Any] | None = None,
) -> int:
    """Fork a session child and confine it: 0 in the child (confined), its pid in the parent.

    The one way every runtime process makes a session (the fork server, the
    probe's check and the snippet runner): in the child, die with the parent,
    ``prepare()`` (the caller's own clean-up: descriptors, signals), then
    :func:`enter_session` (which may change identity, hence die-with-parent
    again), and finally ``chdir`` into ``workdir`` (or the fixed workspace
    path that shows it). ``lineage`` is the directory the session may write
    (``workdir`` by default). ``seed`` (a live session's workdir, and
    descriptors of its namespaces or a pidfd of it, see ``_seed``) fills
    the new session's directory with a copy of that session's files first;
    ``root``: the session's image when not the launch state's (the seed's).
    If any step raises, ``failed(exc)`` reports it and the child exits with
    status 71. With ``own_pids`` in the launch state the session is a
    grandchild (pid 1 of its own PID namespace) that becomes our child when
    the intermediate exits: we become a subreaper, and return its pid.
    """
    global _pid_report_fd
    report = os.pipe2(os.O_CLOEXEC) if own_pids() else None
    if report is not None:
        set_subreaper(True)
    pid = os.fork()
    if pid:
        if report is None:
            return pid
        os.close(report[1])
        try:
            answer = b""
            while chunk := os.read(report[0], 32):
                answer += chunk
        finally:
            os.close(report[0])
        if not answer:  # failed before the fork (already reported): the caller reaps it
            return pid
        try:
            os.waitpid(pid, 0)
        except ChildProcessError:
            pass
        return int(answer)
    if report is not None:
        os.close(report[0])
        _pid_report_fd = report[1]
    try:
        die_with_parent()  # a parent killed for hanging takes this one along
        if prepare is not None:
            prepare()
        seed_fd = upper_fd = None
        if seed is not None:  # opened before our own namespaces exist (see _seed)
            state = _load_state()
            session_ns = bool(state and state.get("session_ns"))
            # namespace descriptors come from a session at the fixed workspace (_seed)
            where = (len(seed[1]) == 2 and fixed_workspace(state)) or seed[0]
            seed_fd = open_seed(seed[1], where, enter=session_ns)
            if session_ns and len(seed[1]) == 2 and image_layers(state, root):
                # an image session's writable layer travels too (see _rootfs)
                hidden, upper = upper_of(os.path.dirname(seed[0].rstrip("/")))
                upper_fd = open_seed(seed[1], upper, enter=True, reveal=hidden)
            for fd in seed[1]:
                os.close(fd)
        try:
            enter_session(
                workdir=lineage or workdir,
                home=workdir,
                seed_fd=seed_fd,
                upper_seed=upper_fd,
                root=root,
            )
        finally:
            if seed_fd is not None:
                os.close(seed_fd)
            if upper_fd is not None:
                os.close(upper_fd)
        die_with_parent()  # a change of identity cleared it
    except BaseException as exc:  # tell the parent why this session cannot start
        try:
            if failed is not None:
                failed(exc)
        finally:
            os._exit(71)
    return 0


# Forked sessions inherit these, so each enter_session() starts warm.
libc()
_load_state()
