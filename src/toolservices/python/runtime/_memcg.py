"""Per-session memory cgroups: the fork server's side (cgroup v1 memory controller).

The host (as root) creates one group per executor and hands it to the
executor's uid; its path (as the server sees it) and the per-session limit
reach the server in ``TOOLSERVICES_MEMCG``. The server makes one child group
per session with that limit, the session joins it right after its fork
(before any layer that would hide the group), and the server removes it once
the session has ended. Everything the session's processes touch counts:
anonymous and shared memory, tmpfs and memfd pages, page cache. Going over
the limit gets a process of the session killed by the kernel (SIGKILL).
"""

from __future__ import annotations

import errno
import json
import os

__all__ = ["ENV", "MemoryGroups"]

ENV = "TOOLSERVICES_MEMCG"
_LIMIT_FILES = ("memory.limit_in_bytes", "memory.memsw.limit_in_bytes")


class MemoryGroups:
    """The server's per-session groups below one executor group."""

    def __init__(self, base: str, limit: int) -> None:
        self.base = base
        self.limit = limit
        self._pending: set[str] = set()  # ended sessions whose group was still busy

    @classmethod
    def from_environ(cls) -> MemoryGroups | None:
        """The groups ``TOOLSERVICES_MEMCG`` describes (removed from the environment)."""
        raw = os.environ.pop(ENV, None)
        if not raw:
            return None
        spec = json.loads(raw)
        return cls(str(spec["dir"]), int(spec["limit"]))

    def create(self, name: str) -> str:
        """A fresh group for one session, with the limit set (swap included where counted)."""
        path = os.path.join(self.base, name)
        os.mkdir(path, 0o755)
        for filename in _LIMIT_FILES:  # memsw may not exist (no swap accounting)
            try:
                with open(os.path.join(path, filename), "w", encoding="ascii") as fh:
                    fh.write(str(self.limit))
            except FileNotFoundError:
                continue
        return path

    def remove(self, name: str) -> None:
        """Remove a session's group, now or (while a process is still in it) later."""
        self._pending.add(os.path.join(self.base, name))
        for path in list(self._pending):
            try:
                os.rmdir(path)
            except OSError as exc:
                if exc.errno == errno.EBUSY:  # a process of it is still exiting
                    continue
            self._pending.discard(path)


def join(path: str) -> None:
    """Move the calling process into the group at ``path`` (its children follow)."""
    with open(os.path.join(path, "cgroup.procs"), "w", encoding="ascii") as fh:
        fh.write("0")
