"""Turn a probe launch into the honest isolation report (one entry per layer)."""

from __future__ import annotations

import os
from typing import Any

from toolservices.python.sandbox._network import (
    allowed_socket_families,
    effective_mode,
    family_names,
)

__all__ = [
    "LEVEL_MEANING",
    "NOT_PROTECTED",
    "build_report",
    "config_rlimits",
    "resolve_address_space",
]

LEVEL_MEANING = {
    "L3": "namespaces: private pid/net/mount/ipc, minimal read-only filesystem",
    "L2": "Landlock/seccomp: filesystem allowlist and socket filtering, no namespaces",
    "L1": "rlimits, clean environment and (as root) a dedicated uid only",
    "L0": "no isolation beyond timeouts and output caps",
}
NOT_PROTECTED = {
    "L3": [
        "kernel bugs (the kernel is shared; use gVisor or a microVM for that)",
        "copies made by fork_session share their source's /tmp, /dev/shm (read-only to them) "
        "and process budget",
        "CPU share between sessions (no cgroup; RLIMIT_CPU and the wall timeout only)",
    ],
    "L2": [
        "processes, mounts, /proc and host routes stay visible",
        "UDP and raw sockets are blocked only when seccomp is active",
        "kernel bugs",
    ],
    "L1": [
        "no network isolation: loopback and the outside world are reachable",
        "no filesystem isolation beyond file permissions: host /tmp is writable",
        "other sessions of the same executor are reachable (same uid)",
        "kernel bugs",
    ],
    "L0": ["everything: user code runs with the caller's privileges"],
}


def config_rlimits(config: Any) -> dict[str, int | None]:
    """The per-session rlimits a :class:`SandboxConfig` sets (NPROC is set per session).

    ``address_space`` is resolved by :func:`resolve_address_space` at launch;
    a named mode still here means ``memory_limit``.
    """
    return {
        "AS": resolve_address_space(config, memory_cgroup=False),
        "CPU": config.cpu_seconds,
        "FSIZE": config.file_size,
        "NOFILE": config.open_files,
        "STACK": config.stack_size,
        "CORE": 0,
    }


def resolve_address_space(config: Any, *, memory_cgroup: bool) -> int | None:
    """``RLIMIT_AS`` for ``config``: ``"cgroup"`` lifts it where a memory cgroup bounds memory."""
    space = config.address_space
    if space == "cgroup" and memory_cgroup:
        return None
    if isinstance(space, str):  # "auto" (the executor's default), "memory_limit", "cgroup"
        return config.memory_limit  # type: ignore[no-any-return]
    return space  # type: ignore[no-any-return]


def _layer(active: bool, detail: str = "", why: str = "") -> dict[str, Any]:
    entry: dict[str, Any] = {"active": active}
    if active:
        entry["detail"] = detail
    else:
        entry["why"] = why or detail
    return entry


def _host_ns() -> dict[str, str]:
    result = {}
    for kind in ("pid", "net", "mnt", "ipc", "uts", "user"):
        try:
            result[kind] = os.readlink(f"/proc/self/ns/{kind}")
        except OSError:
            result[kind] = "?"
    return result


def build_report(
    config: Any,
    *,
    attempt_level: str,
    probe: dict[str, Any],
    uid: int | None,
    nproc: int | None,
    fallbacks: list[dict[str, str]],
    skipped: dict[str, str],
    ro_paths: list[str],
    inside_base: str,
    python: str,
    bwrap: str | None,
) -> dict[str, Any]:
    """The report of a probe launch: each layer with what it does or why it is off.

    Only what the probe observed counts (the namespaces it saw, the seccomp mode
    and no_new_privs of its session), so the level is never better than reality.
    """
    session = probe.get("session", {})
    caller_uid = os.getuid()
    is_root = os.geteuid() == 0
    host = _host_ns()
    inner = probe.get("ns", {})
    private = [k for k in ("pid", "net", "mnt", "ipc", "uts") if inner.get(k) != host.get(k)]
    in_ns = attempt_level == "L3" and {"pid", "mnt"} <= set(private)
    landlock_on = attempt_level in ("L2", "L3") and skipped.get("landlock") is None
    seccomp_on = session.get("seccomp_mode") == 2
    own_ns = bool(session.get("session_ns"))
    layers = _process_layers(
        config,
        session=session,
        probe=probe,
        uid=uid,
        nproc=nproc,
        inside_base=inside_base,
        caller_uid=caller_uid,
        is_root=is_root,
        own_ns=own_ns,
    )
    layers["session_namespaces"] = _layer(
        own_ns,
        "each session has its own user, mount and IPC namespaces: private /tmp and /dev/shm "
        f"tmpfs ({config.tmp_size // (1 << 20)} MiB each), SysV IPC and process budget; "
        "capabilities dropped"
        + (
            "; own PID and cgroup namespaces and /proc: other sessions and the fork server "
            "are invisible and cannot be named (kill, prlimit, setpriority, sched_*, ioprio_set)"
            if session.get("own_pids")
            else ""
        ),
        skipped.get("session_namespaces") or "the kernel refused them in the probe",
    )
    fallback_why = "; ".join(f"{f['level']} failed: {f['error']}" for f in fallbacks)
    layers.update(
        _confinement_layers(
            config,
            probe=probe,
            attempt_level=attempt_level,
            private=private,
            in_ns=in_ns,
            landlock_on=landlock_on,
            seccomp_on=seccomp_on,
            ns_why=skipped.get("namespaces") or fallback_why or "bubblewrap not used",
            skipped=skipped,
            ro_paths=ro_paths,
            uid=uid,
            bwrap=bwrap,
            own_ns=own_ns,
        )
    )
    not_protected = list(NOT_PROTECTED[level_of(in_ns, landlock_on, seccomp_on, is_root, uid)])
    if own_ns:
        not_protected = [
            "no filesystem isolation beyond file permissions (the host's /tmp and /dev/shm "
            "are hidden by the session's own)"
            if item.startswith("no filesystem isolation")
            else item
            for item in not_protected
        ]
    if not own_ns and in_ns:
        not_protected.append(
            "sessions of one executor share its /tmp and /dev/shm (no session namespaces)"
        )
    if in_ns:
        level = "L3"
    elif landlock_on or seccomp_on:
        level = "L2"
    elif is_root and uid is None:
        level = "L0"
    else:
        level = "L1"
    return {
        "level": level,
        "level_meaning": LEVEL_MEANING[level],
        "caller_uid": caller_uid,
        "uid": uid if uid is not None else probe.get("uid"),
        "python": python,
        "bwrap": bwrap,
        "layers": layers,
        "fallbacks": list(fallbacks),
        "not_protected": not_protected,
        "enter_session_seconds": session.get("enter_seconds"),
        "min_level": config.min_level,
    }


def level_of(in_ns: bool, landlock_on: bool, seccomp_on: bool, is_root: bool, uid: Any) -> str:
    if in_ns:
        return "L3"
    if landlock_on or seccomp_on:
        return "L2"
    return "L0" if is_root and uid is None else "L1"


def _process_layers(
    config: Any,
    *,
    session: dict[str, Any],
    probe: dict[str, Any],
    uid: int | None,
    nproc: int | None,
    inside_base: str,
    caller_uid: int,
    is_root: bool,
    own_ns: bool = False,
) -> dict[str, dict[str, Any]]:
    """Layers every level has or lacks per process: environment, limits, identity."""
    layers: dict[str, dict[str, Any]] = {}
    allowed = [n for n in config.env_allowlist if n in os.environ]
    layers["env_allowlist"] = _layer(
        True,
        f"environment cleared; passed through: {', '.join(allowed) or 'nothing'}; "
        "fixed: PATH, LANG, MALLOC_ARENA_MAX=2, *_NUM_THREADS=1"
        + (f"; extra: {', '.join(sorted(config.extra_env))}" if config.extra_env else ""),
    )
    layers["workdir"] = _layer(
        True,
        f"one private 0700 directory per session under {inside_base} (HOME and TMPDIR); "
        "deleted when the session ends",
    )
    limits: dict[str, int | str | None] = {
        **config_rlimits(config),
        "NPROC": None
        if nproc is None
        else (f"{nproc} per session" if own_ns else f"tasks at session start + {nproc}"),
    }
    layers["rlimits"] = _layer(
        True, ", ".join(f"{k}={v}" for k, v in limits.items() if v is not None) + " (hard = soft)"
    )
    layers["process_group"] = _layer(
        True,
        "each session is its own session/process group; "
        "its whole tree is killed on reset and close",
    )
    layers["no_new_privs"] = _layer(
        bool(session.get("no_new_privs")),
        "PR_SET_NO_NEW_PRIVS=1",
        "prctl(PR_SET_NO_NEW_PRIVS) did not hold",
    )
    if uid is not None:
        # the probe (cached per machine) ran under some slot uid; this plan uses ``uid``
        dropped = probe.get("uid") not in (None, 0) and session.get("uid") == probe.get("uid")
        layers["uid_drop"] = _layer(
            dropped,
            f"user code runs as dedicated uid {uid}",
            f"probe ran as uid {probe.get('uid')}, expected a dedicated uid",
        )
    elif is_root:
        layers["uid_drop"] = _layer(
            False,
            why="user code runs as root (allow_unsafe=True): no launch under a dedicated uid "
            "worked, see fallbacks",
        )
    else:
        layers["uid_drop"] = _layer(
            False, why=f"not root: runs as the caller's uid {caller_uid} (nothing to drop)"
        )
    if nproc is None:
        layers["nproc_limit"] = _layer(False, why="disabled (SandboxConfig(nproc=None))")
    elif own_ns:
        # own_pids rules out copies of an interpreter's memory: every copy is a fresh session
        # (spawn_with_files, which a ShellService's fork_session is)
        copies = (
            "each fork_session copy has its own: with own_pids copies are fresh sessions"
            if getattr(config, "own_pids", False)
            else "its copies from fork_session share it"
        )
        layers["nproc_limit"] = _layer(
            True,
            f"RLIMIT_NPROC counted in the session's own user namespace: {nproc} processes and "
            f"threads per session ({copies}), whatever the other sessions or the caller run",
        )
    else:
        owner = f"dedicated uid {uid}" if uid is not None else f"the caller's uid {caller_uid}"
        layers["nproc_limit"] = _layer(
            True,
            f"RLIMIT_NPROC = tasks running when the session starts + {nproc}, on {owner}: "
            "a fork bomb stops after that many new processes or threads (shared with the "
            "other sessions of that uid: no session namespaces)",
        )
    return layers


def _confinement_layers(
    config: Any,
    *,
    probe: dict[str, Any],
    attempt_level: str,
    private: list[str],
    in_ns: bool,
    landlock_on: bool,
    seccomp_on: bool,
    ns_why: str,
    skipped: dict[str, str],
    ro_paths: list[str],
    uid: int | None,
    bwrap: str | None,
    own_ns: bool = False,
) -> dict[str, dict[str, Any]]:
    """Layers that differ by level: namespaces, network, filesystem, seccomp, Landlock."""
    layers: dict[str, dict[str, Any]] = {}
    layers["namespaces"] = _layer(
        in_ns,
        f"bubblewrap {bwrap}: private {', '.join(private)}"
        + ("" if "net" in private else " (network shared)"),
        f"bwrap not usable: {ns_why}",
    )
    if config.network == "host":
        layers["network"] = _layer(
            False, why="allowed by network='host' (SandboxConfig(network=True))"
        )
    elif config.network == "loopback" and own_ns:
        layers["network"] = _layer(
            True, "loopback: each session its own network namespace, only lo up"
        )
    elif in_ns and "net" in private:
        layers["network"] = _layer(True, "none: empty network namespace (own loopback only)")
    elif landlock_on or seccomp_on:
        parts = (
            ["TCP bind/connect denied by Landlock"]
            if landlock_on and (probe.get("landlock_abi") or 0) >= 4
            else []
        )
        parts += ["inet/inet6/packet/netlink sockets denied by seccomp"] if seccomp_on else []
        layers["network"] = _layer(bool(parts), "; ".join(parts), "Landlock ABI < 4 and no seccomp")
    else:
        layers["network"] = _layer(
            False, why=f"needs bwrap (L3), or Landlock ABI >= 4 / seccomp (L2): {ns_why}"
        )
    ro_list = ", ".join(ro_paths[:6]) + (" ..." if len(ro_paths) > 6 else "")
    if in_ns:
        layers["readonly_fs"] = _layer(
            True,
            f"minimal read-only root: {ro_list}; writable: "
            "session workdir, private /tmp and /dev/shm",
        )
    elif landlock_on:
        layers["readonly_fs"] = _layer(
            True,
            f"Landlock allowlist: read {ro_list}, /proc; write only the session workdir"
            + (", its private /tmp and /dev/shm" if own_ns else "")
            + (
                " and the host's /dev/shm (host_shm=True)" if config.host_shm and not own_ns else ""
            ),
        )
    else:
        layers["readonly_fs"] = _layer(
            False, why="needs bwrap (L3) or Landlock (L2); " + (skipped.get("landlock") or ns_why)
        )
    layers["private_tmp"] = _layer(
        in_ns or own_ns,
        f"private tmpfs /tmp and /dev/shm, {config.tmp_size // (1 << 20)} MiB each, "
        + ("per session" if own_ns else "shared by the sessions of one executor"),
        "needs bwrap (L3) or session namespaces; TMPDIR points at the session workdir instead"
        + ("" if config.host_shm else "; /dev/shm is not writable (multiprocessing locks fail)"),
    )
    layers["seccomp"] = _layer(
        seccomp_on,
        "deny list: namespaces, mount, ptrace, bpf, "
        "perf_event_open, userfaultfd, io_uring, keyctl, TIOCSTI; socket families allowed: "
        + family_names(allowed_socket_families(effective_mode(config.network, session_ns=own_ns)))
        + " (every other one, AF_VSOCK and AF_PACKET included, fails with EAFNOSUPPORT)",
        skipped.get("seccomp") or "the filter was not in force in the probe",
    )
    landlock_abi = probe.get("landlock_abi") or 0
    layers["landlock"] = _layer(
        landlock_on,
        f"ABI {landlock_abi}: writes only in "
        "the workdir"
        + (", /tmp, /dev/shm" if in_ns or own_ns else "")
        # scoping is requested always but exists only from ABI 6 on
        + (
            "; signals and abstract sockets scoped to the sandbox"
            if landlock_abi >= 6
            else "; signals and abstract sockets not scoped (needs ABI >= 6)"
        ),
        skipped.get("landlock") or f"not applied at {attempt_level}",
    )
    layers["orphan_cleanup"] = _layer(
        True,
        "PID namespace: everything dies with the server"
        if in_ns
        else "server is a child subreaper"
        + ("; leftover processes of the uid are killed on close" if uid is not None else ""),
    )
    return layers
