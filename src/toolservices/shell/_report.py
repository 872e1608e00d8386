"""The isolation report of a ``ShellService``: the Python executor's, plus the shell's layers."""

from __future__ import annotations

from typing import Any

__all__ = ["shell_report"]

#: What a shell's fork_session copies share (its report says it instead of the executor's).
_SHELL_COPIES = (
    "copies made by fork_session are fresh sessions (own /tmp, /dev/shm, process budget, "
    "disk quota and memory group) that start with a copy of the source's workspace, HOME "
    "and shell state; background processes of the source are not copied"
)


def _landlock_abi() -> int:
    from toolservices.python.runtime import landlock_abi

    return landlock_abi()


def shell_report(report: dict[str, Any], *, disk_quota: int | None) -> dict[str, Any]:
    """``report`` (the executor's) with two shell layers and what a shell's copies share.

    ``disk_quota`` (the workspace tmpfs, which needs session namespaces) and
    ``command_scope`` (commands cannot signal their session's supervisor:
    Landlock ABI >= 6, i.e. the report's ``landlock`` layer with scoping).
    """
    report = dict(report)
    layers = dict(report.get("layers", {}))
    own_ns = bool(layers.get("session_namespaces", {}).get("active"))
    quota = disk_quota
    layers["disk_quota"] = {
        "active": own_ns and quota is not None,
        "detail": f"each session's workspace is a private tmpfs of {quota} bytes"
        if own_ns and quota is not None
        else "off: needs session namespaces and a disk_quota; only file_size caps a file",
    }
    abi = _landlock_abi()
    apart = (
        "; each command's bash has a Landlock domain of its own: no process of another "
        "command (a background job) can open its descriptors or memory "
        "(/proc/<pid>/fd, /proc/<pid>/mem, pidfd_getfd), so none can write the command "
        "pipe or output of the bash waiting for the next command"
        if abi >= 1
        else ""
    )
    layers["command_scope"] = {
        "active": abi >= 6,
        "detail": "commands run in a nested Landlock domain scoped for signals: "
        "they cannot signal their session's supervisor" + apart
        if abi >= 6
        else f"off: needs Landlock ABI >= 6 (this kernel: {abi}); a command can kill "
        "its session's supervisor, which loses the session" + apart,
    }
    # A shell fork_session makes fresh sessions (spawn_with_files), not forks sharing
    # the source's namespaces as the executor's fork_session does: say what is true here.
    report["not_protected"] = [
        _SHELL_COPIES if entry.startswith("copies made by fork_session") else entry
        for entry in report.get("not_protected", [])
    ]
    report["layers"] = layers
    return report
