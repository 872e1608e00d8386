"""The runtime side: what runs in the fork server, the sessions and the launcher.

Everything in this package imports only the standard library and its own
modules (relatively), so that the processes it runs in do not carry the rest
of ``toolservices`` (pydantic, anyio, the trainer's imports). Those processes
start it one way: by the path of an entry module (:func:`script`), whose
first lines load this directory as the package ``_toolservices_runtime``
(see ``_bootstrap``). The parent imports the same modules as
``toolservices.python.runtime``.

The names the host and the sandbox use (the channel's frames, the session's
confinement) are exported here for the parent only: the runtime processes
load this file too, under ``_toolservices_runtime``, and skip those imports,
so a launch pays for nothing it does not run.
"""

from __future__ import annotations

import os

if __name__ == "toolservices.python.runtime":  # the parent's import, not a runtime process's
    from ._confine import (
        STATE_ENV,
        SessionSetupError,
        enter_session,
        landlock_abi,
        remove_tree,
        uid_tasks,
    )
    from ._imagepy import runtime_zip_bytes
    from ._memcg import ENV as MEMCG_ENV
    from ._protocol import (
        AFTER_REPLY,
        ANC_SPACE,
        EXIT_BROKEN,
        HEADER,
        Adopt,
        Config,
        Discard,
        Error,
        Exec,
        Fork,
        Frame,
        Hello,
        Kill,
        Kind,
        Message,
        Mkdirs,
        Ok,
        PeerClosed,
        ProtocolViolation,
        Ready,
        Release,
        Result,
        Spawn,
        ancillary,
        fds_from_ancdata,
        new_seq,
    )

__all__ = [
    "AFTER_REPLY",
    "ANC_SPACE",
    "EXIT_BROKEN",
    "HEADER",
    "MEMCG_ENV",
    "RUNTIME_DIR",
    "STATE_ENV",
    "Adopt",
    "Config",
    "Discard",
    "Error",
    "Exec",
    "Fork",
    "Frame",
    "Hello",
    "Kill",
    "Kind",
    "Message",
    "Mkdirs",
    "Ok",
    "PeerClosed",
    "ProtocolViolation",
    "Ready",
    "Release",
    "Result",
    "SessionSetupError",
    "Spawn",
    "ancillary",
    "enter_session",
    "fds_from_ancdata",
    "landlock_abi",
    "new_seq",
    "remove_tree",
    "runtime_zip_bytes",
    "script",
    "uid_tasks",
]

RUNTIME_DIR = os.path.dirname(os.path.abspath(__file__))


def script(name: str) -> str:
    """The path of the entry module ``name`` (``"_forkserver"``, ``"_launch"``...)."""
    return os.path.join(RUNTIME_DIR, f"{name}.py")
