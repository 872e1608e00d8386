"""What makes a shell session's commands feel like a normal terminal (inside the session).

Standard library only; sent to the session with ``_supervisor`` (see there),
which calls these when it starts its spawner: the commands' limits (a usual
soft stack), their environment (a private HOME outside the workspace with a
git identity, an honest ``nproc``, fast failures without a network).
"""

from __future__ import annotations

import os
import re
import resource

#: HOME of a session whose /tmp is its own (session namespaces): outside the repository.
_HOME = "/tmp/home"
#: the workspace paths that mean session namespaces (so a private /tmp)
_FIXED_WORKSPACES = ("/workspace", "/tmp/workspace")
_GITCONFIG = (
    "[user]\n\tname = sandbox\n\temail = sandbox@localhost\n[init]\n\tdefaultBranch = main\n"
)
#: variables the executor sets for Python sessions that would make ``nproc`` lie
_THREAD_CAPS = (
    "OMP_NUM_THREADS",
    "OPENBLAS_NUM_THREADS",
    "MKL_NUM_THREADS",
    "NUMEXPR_NUM_THREADS",
    "VECLIB_MAXIMUM_THREADS",
)


def make_home(workspace: str) -> str:
    """The session's HOME: private, outside the workspace (``git add -A`` never sees it).

    It lives in the session's own ``/tmp`` and starts with a git identity
    (``git config --global`` or ``GIT_AUTHOR_*`` override it). Without
    session namespaces ``/tmp`` is the host's: HOME stays the workspace.
    """
    if workspace not in _FIXED_WORKSPACES:
        return workspace
    try:
        os.makedirs(_HOME, 0o700, exist_ok=True)
        gitconfig = os.path.join(_HOME, ".gitconfig")
        if not os.path.exists(gitconfig):
            with open(gitconfig, "w", encoding="utf-8") as handle:
                handle.write(_GITCONFIG)
    except OSError:  # a full /tmp: the workspace, as before
        return workspace
    return _HOME


def command_env(env: dict[str, str], home: str, offline: bool) -> dict[str, str]:
    """The environment of every bash: HOME, an honest ``nproc``, fast no-network failures."""
    env.pop("PWD", None)
    env["HOME"] = home
    for name in _THREAD_CAPS:  # coreutils' nproc obeys OMP_NUM_THREADS
        env.pop(name, None)
    if offline:  # pip and npm fail at once, saying there is no index, instead of retrying DNS
        env.setdefault("PIP_NO_INDEX", "1")
        env.setdefault("PIP_DISABLE_PIP_VERSION_CHECK", "1")
        env.setdefault("npm_config_offline", "true")
    return env


def command_limits(stack: int | None) -> None:
    """Commands start with a usual terminal's soft stack limit, not the session's.

    The session's ``RLIMIT_STACK`` (hard = soft) is sized for the Python
    executor's deep recursion; glibc gives every thread of a command a stack
    of the soft limit, so at 128 MiB a JVM or a thread pool runs out of
    address space after a few threads. Only the soft limit drops:
    ``ulimit -s`` can raise it again up to the session's.
    """
    if stack is None:
        return
    soft, hard = resource.getrlimit(resource.RLIMIT_STACK)
    target = stack if hard == resource.RLIM_INFINITY else min(stack, hard)
    if soft == resource.RLIM_INFINITY or soft > target:
        resource.setrlimit(resource.RLIMIT_STACK, (target, hard))
    _printed.clear()


#: ``ulimit -a`` (bash, not in POSIX mode) flag: the limit and the unit it is printed in
_ULIMITS = {
    "c": (resource.RLIMIT_CORE, 1024),
    "d": (resource.RLIMIT_DATA, 1024),
    "f": (resource.RLIMIT_FSIZE, 1024),
    "l": (resource.RLIMIT_MEMLOCK, 1024),
    "m": (resource.RLIMIT_RSS, 1024),
    "n": (resource.RLIMIT_NOFILE, 1),
    "s": (resource.RLIMIT_STACK, 1024),
    "t": (resource.RLIMIT_CPU, 1),
    "u": (resource.RLIMIT_NPROC, 1),
    "v": (resource.RLIMIT_AS, 1024),
    "e": (resource.RLIMIT_NICE, 1),
    "i": (resource.RLIMIT_SIGPENDING, 1),
    "q": (resource.RLIMIT_MSGQUEUE, 1),
    "r": (resource.RLIMIT_RTPRIO, 1),
    "R": (resource.RLIMIT_RTTIME, 1),
    "x": (10, 1),  # RLIMIT_LOCKS (Linux), which the resource module does not name
}
_LIMITS_BLOCK = re.compile(r"#ts-limits -S\n(.*?)#ts-limits -H\n(.*?)#ts-limits end\n", re.S)
_LIMIT_LINE = re.compile(r"-(\w)\) (\S+)$", re.M)


def compact_limits(state: str) -> str:
    """Turn the saved ``ulimit -a`` listings into ``ulimit`` commands for what changed.

    A bash starts with the session's limits (this process's); only a limit a
    command changed needs restoring, and one builtin call per such limit
    costs nothing next to reading the listings back in bash (about 1.3 ms a
    command). Soft values come first: they never exceed the hard ones kept.
    """
    found = _LIMITS_BLOCK.search(state)
    if found is None:
        return state
    lines = []
    for option, block, index in (("-S", found.group(1), 0), ("-H", found.group(2), 1)):
        for flag, value in _LIMIT_LINE.findall(block):
            if flag == "p" or value == _current(flag, index):  # pipe size: read-only
                continue
            lines.append(f"builtin ulimit {option} -{flag} {value} 2>/dev/null\n")
    return state[: found.start()] + "".join(lines) + state[found.end() :]


#: this process's limits as ``ulimit -a`` prints them (they never change once the
#: session's supervisor set them up: read once, not 32 system calls a command)
_printed: dict[tuple[str, int], str | None] = {}


def _current(flag: str, index: int) -> str | None:
    """This process's soft (0) or hard (1) limit as ``ulimit -a`` prints it; None: unknown."""
    key = (flag, index)
    if key not in _printed:
        known = _ULIMITS.get(flag)
        if known is None:
            _printed[key] = None
        else:
            value = resource.getrlimit(known[0])[index]
            _printed[key] = (
                "unlimited" if value == resource.RLIM_INFINITY else str(value // known[1])
            )
    return _printed[key]
