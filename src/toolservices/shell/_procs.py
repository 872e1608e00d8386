"""The session's processes, read from ``/proc`` (inside the session, standard library only).

Sent to the session with ``_supervisor`` (see there). The supervisor is the
session's pid 1 and a subreaper: these find a command's processes (its
group, and those that left it but came back to the supervisor as orphans),
kill a timed-out command's tree without touching earlier commands' jobs,
spot a program waiting for keys from a terminal that does not exist, and
collect finished orphans.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Collection


def killpg(pid: int) -> None:
    """SIGKILL the process group ``pid`` and the process ``pid`` (a live bash's copy makes its
    own group as its first step: one killed before that is in none yet)."""
    for kill in (os.killpg, os.kill):
        try:
            kill(pid, signal.SIGKILL)
        except OSError:
            pass


def stat_fields(pid: int | str) -> list[bytes]:
    """The fields of /proc/<pid>/stat after the command name (state is [0], ppid [1])."""
    with open(f"/proc/{pid}/stat", "rb") as fh:
        return fh.read().rsplit(b")", 1)[1].split()


def state(pid: int) -> bytes:
    try:
        return stat_fields(pid)[0]
    except (OSError, IndexError):
        return b"X"


def parent(pid: int) -> int:
    try:
        return int(stat_fields(pid)[1])
    except (OSError, ValueError, IndexError):
        return 0


def waits_for_terminal(group: int, pipes: set[int]) -> str:
    """The name of a sleeping process of ``group`` whose stdin is a write-only output pipe, or "".

    With no terminal, vim (``vi``, ``view``, ``ex``) takes its stderr as its input
    once stdin ends, and waits for it to become readable: a write-only pipe
    never does. Nothing can ever arrive there, so the wait would last until
    the time limit.
    """
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            fields = stat_fields(name)
            if int(fields[2]) != group or fields[0] != b"S":
                continue
            if os.stat(f"/proc/{name}/fd/0").st_ino not in pipes:
                continue
            with open(f"/proc/{name}/wchan", "rb") as fh:
                wchan = fh.read()
            if b"select" not in wchan and b"poll" not in wchan:
                continue  # asleep for another reason (sleep, a child, a lock)
            with open(f"/proc/{name}/fdinfo/0", "rb") as fh:
                info = fh.read()
            flags = int(info.split(b"flags:", 1)[1].split()[0], 8)
            if flags & os.O_ACCMODE != os.O_WRONLY:
                continue
            with open(f"/proc/{name}/comm", "rb") as fh:
                return fh.read().strip().decode("utf-8", "replace") or "?"
        except (OSError, ValueError, IndexError):
            continue
    return ""


_TICKS = os.sysconf("SC_CLK_TCK")


def now_ticks() -> int:
    """The clock ``start_time`` counts in (ticks since boot), now: a process started from
    here on has a start time not below it (one system call, not a read of ``/proc``)."""
    return int(time.clock_gettime(time.CLOCK_BOOTTIME) * _TICKS)


def children(root: int, skip: Collection[int] = ()) -> dict[int, tuple[int, int]]:
    """``root``'s children now but ``skip`` (the session's own, which no tree kill takes: not
    read), pid -> (start time, to tell a reused pid apart; group)."""
    pids: list[int] = []
    try:
        for task in os.listdir(f"/proc/{root}/task"):
            with open(f"/proc/{root}/task/{task}/children", "rb") as fh:
                pids.extend(int(p) for p in fh.read().split())
    except FileNotFoundError:  # a kernel without CONFIG_PROC_CHILDREN: scan
        pids = [
            int(name)
            for name in os.listdir("/proc")
            if name.isdigit() and parent(int(name)) == root
        ]
    found = {}
    for pid in pids:
        if pid in skip:
            continue
        try:
            fields = stat_fields(pid)
            found[pid] = (int(fields[19]), int(fields[2]))
        except (OSError, ValueError, IndexError):
            continue  # gone already
    return found


def kill_tree(
    root: int, bash: int, born: int, spared: set[int], earlier: dict[int, tuple[int, int]]
) -> None:
    """Kill the timed-out command's tree, and nothing of the commands before it.

    Orphans come back to ``root`` (a subreaper). Among its children, the
    command's are those in its process group (``bash``'s pid) or started after
    its bash (a higher pid and a start time not before ``born``: ``setsid``,
    double forks) and not among ``earlier`` (root's children when the command
    started: the spare bash is started when the previous command ends, so a job
    that command put in the background can fork after it); everything below
    them goes too. Background jobs of earlier commands are in older groups, and
    so are the processes they start later (an orphan of their double fork is
    spared by its group); ``spared`` (the spawner, the live bash) stays.
    """
    older = {group for _start, group in earlier.values() if group != bash}
    for _ in range(16):
        info: dict[int, tuple[int, int, int, bytes]] = {}  # pid -> ppid, pgid, start, state
        for name in os.listdir("/proc"):
            if name.isdigit():
                try:
                    fields = stat_fields(name)
                    info[int(name)] = (int(fields[1]), int(fields[2]), int(fields[19]), fields[0])
                except (OSError, ValueError, IndexError):
                    continue
        frontier = {
            pid
            for pid, (ppid, pgid, start, _state) in info.items()
            if ppid == root
            and pid not in spared
            and (
                pgid == bash
                or (
                    pid >= bash
                    and start >= born
                    and earlier.get(pid, (-1, -1))[0] != start
                    and pgid not in older
                )
            )
        }
        tree: set[int] = set()
        while frontier:
            tree |= frontier
            frontier = {p for p, row in info.items() if row[0] in frontier} - tree
        victims = [p for p in tree if info[p][3] != b"Z"]
        for pid in victims:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                continue
        reap()
        if not victims:
            return


def reap() -> None:
    """Collect orphans this subreaper inherited (background jobs that ended)."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
