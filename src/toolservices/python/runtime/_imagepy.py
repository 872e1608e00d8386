"""Sessions on an image's own Python: the confined child execs it with this runtime.

A session on an image (``SandboxConfig.root_python``) is forked and confined
as every session is (namespaces, the image as its root, rlimits, Landlock,
seccomp: all of them survive ``execve``), then, instead of serving in the
fork server's interpreter, it execs the image's ``python3``, which runs this
runtime from a zip archive in a memfd (made by the fork server before any
session: the runtime's files are not in the image's root) and serves the
session's channel. User code then imports what the image's Python has (its
site-packages, its version), not the host's.

Standard library only, and Python 3.10 or newer in the image (the runtime
uses ``zip(strict=)`` and ``dataclass(slots=)``).
"""

from __future__ import annotations

import fcntl
import json
import os
import sys
from typing import NoReturn

PACKAGE = "_toolservices_runtime"

# Run as the zip's __main__ by the image's Python: the runtime as the package it is in the
# fork server, its place on sys.path gone again (user code must not see it), the launch
# state taken (enter_copy and the workspace need it) and out of the environment.
_MAIN = f"""
import json, os, socket, sys
if sys.version_info < (3, 10):
    sys.exit("toolservices: the image's Python is " + sys.version.split()[0] + ": 3.10 or newer")
here = sys.path[0]
from {PACKAGE} import _confine, _worker
sys.path.remove(here)  # the package keeps its own __path__ into the zip
_confine._load_state()
os.environ.pop(_confine.STATE_ENV, None)
args = json.loads(sys.argv[1])
os.close(args["zip"])
chan = socket.socket(fileno=args["chan"])
chan.set_inheritable(False)
_worker.serve_session(chan, max_output=args["max_output"], busy_poll=args["busy_poll"])
"""


def root_python(state: dict[str, object] | None) -> str:
    """The image's Python the launch state names ('' when sessions run on the host's)."""
    session_ns = state.get("session_ns") if state else None
    return str(session_ns.get("python") or "") if isinstance(session_ns, dict) else ""


def _pyc(source: bytes, name: str) -> bytes:
    """``source`` compiled by this interpreter, as an unchecked hash-based ``.pyc`` (PEP 552):
    an image's Python of the same version (magic number) loads it instead of compiling the
    runtime at every start (half the CPU of a judge's request on the Debian image here);
    another version ignores it and compiles the ``.py`` beside it."""
    import importlib.util
    import marshal

    code = compile(source, name, "exec", dont_inherit=True)
    flags = (0b01).to_bytes(4, "little")  # hash-based, not checked against the source
    return (
        importlib.util.MAGIC_NUMBER
        + flags
        + importlib.util.source_hash(source)
        + marshal.dumps(code)
    )


def runtime_zip_bytes() -> bytes:
    """This runtime as a zip archive with a ``__main__`` (what :func:`runtime_zip` holds).

    A shell session on an image gets these bytes from the host (its root has
    neither the runtime's files nor ``zipfile``) and seals them with
    :func:`sealed_memfd` for the Python tool's interpreter.
    """
    import io
    import zipfile  # only here: it imports threading, which no fork server may hold

    here = os.path.dirname(os.path.abspath(__file__))
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_STORED) as archive:
        archive.writestr("__main__.py", _MAIN)
        for name in sorted(os.listdir(here)):
            if name.endswith(".py"):
                with open(os.path.join(here, name), "rb") as fh:
                    source = fh.read()
                archive.writestr(f"{PACKAGE}/{name}", source)
                archive.writestr(f"{PACKAGE}/{name}c", _pyc(source, f"{PACKAGE}/{name}"))
    return buffer.getvalue()


def sealed_memfd(data: bytes, name: str = "toolservices-runtime") -> int:
    """A memfd holding ``data``, sealed: no process that gets it can change it."""
    fd = os.memfd_create(name, os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]
    # every image session gets this one file: sealed, none of them can change it for the next
    seals = fcntl.F_SEAL_WRITE | fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL
    fcntl.fcntl(fd, fcntl.F_ADD_SEALS, seals)
    return fd


def runtime_zip() -> int:
    """A memfd holding this runtime as a zip archive with a ``__main__``."""
    return sealed_memfd(runtime_zip_bytes())


def exec_image_python(
    python: str, zip_fd: int, chan_fd: int, *, max_output: int, busy_poll: float, state: str
) -> NoReturn:
    """Replace this confined session child by the image's Python serving ``chan_fd``."""
    os.set_inheritable(zip_fd, True)
    os.set_inheritable(chan_fd, True)
    os.environ["TOOLSERVICES_SANDBOX_STATE"] = state
    args = {"zip": zip_fd, "chan": chan_fd, "max_output": max_output, "busy_poll": busy_poll}
    sys.stdout.flush()
    sys.stderr.flush()
    # -s: no user site (the image's own site-packages stay); the zip by its /proc path
    os.execv(python, [python, "-s", f"/proc/self/fd/{zip_fd}", json.dumps(args)])
