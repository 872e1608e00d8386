"""Per-session memory cgroups: the host's side (one group per executor, handed to its uid).

Needs root (the sessions' dedicated uid gets the group) and the cgroup v1
memory controller; the fork server then makes one child group per session
(``runtime/_memcg.py``). A cgroup v2 memory controller is not used yet: it
needs a delegated subtree, which a process inside its own leaf group cannot
make for itself (the "no internal processes" rule).
"""

from __future__ import annotations

import json
import os
import secrets

from toolservices.python.runtime import MEMCG_ENV as ENV

__all__ = ["ENV", "INSIDE", "create", "env_value", "remove", "sweep_stale"]

#: where the executor's group appears inside bubblewrap
INSIDE = "/run/toolservices-memcg"
_PREFIX = "toolservices-memcg-"


def own_group() -> tuple[str | None, str]:
    """The directory of this process's cgroup v1 memory group, or (None, why not)."""
    relative = None
    try:
        with open("/proc/self/cgroup", encoding="ascii") as fh:
            for line in fh:
                _, controllers, path = line.rstrip("\n").split(":", 2)
                if "memory" in controllers.split(","):
                    relative = path
    except (OSError, ValueError) as exc:
        return None, f"cannot read /proc/self/cgroup: {exc}"
    if relative is None:
        return None, "no cgroup v1 memory controller (cgroup v2 memory is not supported yet)"
    try:
        with open("/proc/self/mountinfo", encoding="utf-8") as fh:
            for line in fh:
                fields = line.split()
                sep = fields.index("-")
                fstype, options = fields[sep + 1], fields[-1].split(",")
                root, mount = fields[3], fields[4]
                if fstype == "cgroup" and "memory" in options and relative.startswith(root):
                    inner = relative[len(root) :].lstrip("/") if root != "/" else relative[1:]
                    return os.path.join(mount, inner), ""
    except (OSError, ValueError) as exc:
        return None, f"cannot read /proc/self/mountinfo: {exc}"
    return None, "the cgroup v1 memory hierarchy is not mounted here"


def create(uid: int) -> tuple[str | None, str]:
    """A new group for one executor, owned by ``uid``; or (None, why not)."""
    if os.geteuid() != 0:
        return None, "needs root (to hand a memory cgroup to the sessions' uid)"
    parent, why = own_group()
    if parent is None:
        return None, why
    sweep_stale(parent)
    path = os.path.join(parent, f"{_PREFIX}{os.getpid()}-{secrets.token_hex(4)}")
    try:
        os.mkdir(path, 0o755)
    except OSError as exc:
        return None, f"cannot create a memory cgroup under {parent}: {exc}"
    try:
        os.chown(path, uid, uid)
    except OSError as exc:
        remove(path)
        return None, f"cannot hand the memory cgroup {path} to uid {uid}: {exc}"
    return path, ""


def env_value(path: str, limit: int) -> str:
    """What the fork server reads from ``TOOLSERVICES_MEMCG``."""
    return json.dumps({"dir": path, "limit": limit}, separators=(",", ":"))


def remove(path: str) -> bool:
    """Remove an executor's group and its sessions' groups (empty once their processes are
    gone; their memory is then charged to the parent). True when it is gone."""
    try:
        with os.scandir(path) as entries:
            children = [e.path for e in entries if e.is_dir(follow_symlinks=False)]
    except FileNotFoundError:
        return True
    except OSError:
        return False
    for child in children:
        try:
            os.rmdir(child)
        except OSError:
            pass
    try:
        os.rmdir(path)
    except FileNotFoundError:
        return True
    except OSError:
        return False
    return True


def sweep_stale(parent: str) -> None:
    """Remove the groups of executors whose owning process is gone (a SIGKILLed caller)."""
    try:
        names = os.listdir(parent)
    except OSError:
        return
    for name in names:
        owner = name[len(_PREFIX) :].split("-", 1)[0]
        if not name.startswith(_PREFIX) or not owner.isdigit():
            continue
        try:
            os.kill(int(owner), 0)
            continue
        except ProcessLookupError:
            remove(os.path.join(parent, name))
        except PermissionError:
            continue
