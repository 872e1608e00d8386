"""The default ``max_sessions``: as many idle sessions as half the free memory holds.

An idle session costs 2.2-2.4 MiB of PSS on the project's VM (``docs/benchmarks.md``,
flat from 64 to 4,096 sessions); :data:`SESSION_BYTES` rounds that up for what
sessions allocate once they run real code. The memory counted is the smaller of the kernel's
``MemAvailable`` and what the caller's memory cgroup (v2 or v1, every ancestor)
still allows; half of it is given to sessions, the rest stays with the trainer
and everything else on the machine. The result is clamped between
:data:`FLOOR` (a rollout batch's worth: fewer would evict episodes mid-rollout)
and :data:`CAP`. Read when the executor is constructed, so a Ray replica sizes
itself from its own node.

Each live session also holds a few file descriptors in the caller's process
(its channel, output memfds, and a shell session's namespace descriptors), so
:func:`raise_fd_limit` lifts the soft ``RLIMIT_NOFILE`` to the hard one and the
default never plans more sessions than the descriptors left can serve.
"""

from __future__ import annotations

import logging
import os
import resource

__all__ = [
    "CAP",
    "FLOOR",
    "SESSION_BYTES",
    "default_max_sessions",
    "free_memory",
    "raise_fd_limit",
]

log = logging.getLogger(__name__)

#: memory reserved per session: 2.2-2.4 MiB measured idle, rounded up
SESSION_BYTES = 3 << 20
#: the share of the free memory that sessions may take
SHARE = 0.5
#: never fewer (256 rollouts per step are common) ...
FLOOR = 256
#: ... nor more (4,096 were measured on one machine; more wants a cluster)
CAP = 16384
#: descriptors a Python session holds in the caller (channel, stdout and stderr memfds)
SESSION_FDS = 3
#: descriptors left to the rest of the caller's process (Ray, sockets, files)
FD_MARGIN = 512
#: what cgroup v1 reports for "no limit" is close to 2**63; anything this large is no limit
_UNLIMITED = 1 << 60


def _read_int(path: str) -> int | None:
    try:
        with open(path, encoding="ascii") as fh:
            text = fh.read().strip()
    except (OSError, UnicodeDecodeError):
        return None
    if text == "max":
        return None
    try:
        return int(text)
    except ValueError:
        return None


def _mem_available(root: str) -> int | None:
    try:
        with open(os.path.join(root, "proc/meminfo"), encoding="ascii") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def _cgroup_room(root: str) -> int | None:
    """Bytes the caller's memory cgroups still allow (the tightest ancestor), or None."""
    try:
        with open(os.path.join(root, "proc/self/cgroup"), encoding="ascii") as fh:
            lines = fh.read().splitlines()
    except OSError:
        return None
    rooms: list[int] = []
    for line in lines:
        hierarchy, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        if hierarchy == "0" and not controllers:  # v2 (the unified hierarchy)
            base, limit_file, usage_file = "sys/fs/cgroup", "memory.max", "memory.current"
        elif "memory" in controllers.split(","):  # v1
            base = "sys/fs/cgroup/memory"
            limit_file, usage_file = "memory.limit_in_bytes", "memory.usage_in_bytes"
        else:
            continue
        parts = [p for p in path.split("/") if p]
        for depth in range(len(parts), -1, -1):  # the group itself, then each ancestor
            group = os.path.join(root, base, *parts[:depth])
            limit = _read_int(os.path.join(group, limit_file))
            if limit is None or limit >= _UNLIMITED:
                continue
            usage = _read_int(os.path.join(group, usage_file)) or 0
            rooms.append(max(0, limit - usage))
    return min(rooms) if rooms else None


def free_memory(root: str = "/") -> int | None:
    """Bytes free for new processes: ``MemAvailable``, or less if a memory cgroup says so."""
    known = [x for x in (_mem_available(root), _cgroup_room(root)) if x is not None]
    return min(known) if known else None


def raise_fd_limit() -> int:
    """Lift the soft ``RLIMIT_NOFILE`` to the hard limit (or ``fs.nr_open``); the soft limit now."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    ceiling = _read_int("/proc/sys/fs/nr_open") or 1 << 20
    target = ceiling if hard == resource.RLIM_INFINITY else min(hard, ceiling)
    if soft != resource.RLIM_INFINITY and soft < target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            log.debug("RLIMIT_NOFILE raised from %d to %d for sessions' descriptors", soft, target)
            soft = target
        except (OSError, ValueError) as exc:
            log.debug("could not raise RLIMIT_NOFILE from %d: %s", soft, exc)
    return ceiling if soft == resource.RLIM_INFINITY else soft


def default_max_sessions(
    *,
    pool_size: int = 1,
    root: str = "/",
    session_bytes: int = SESSION_BYTES,
    session_fds: int = SESSION_FDS,
    nofile: int | None = None,
) -> int:
    """Half the free memory in idle sessions, within ``[FLOOR, CAP]`` and at least ``pool_size``,
    and no more than the file descriptors left can serve.

    ``root`` is where ``proc/`` and ``sys/`` are found (tests point it at a fake tree);
    ``session_bytes``, ``session_fds``: what one session takes (a shell session more);
    ``nofile``: the descriptor limit (by default lifted and read here).
    """
    free = free_memory(root)
    count = FLOOR if free is None else int(free * SHARE) // session_bytes
    limit = raise_fd_limit() if nofile is None else nofile
    by_fds = max(1, (limit - FD_MARGIN) // session_fds)
    return max(pool_size, min(CAP, max(FLOOR, count), by_fds))
