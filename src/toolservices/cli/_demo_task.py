"""The demo's image scenario: an episode fixes a bug in a repository an image ships.

The image is built at run time (:mod:`toolservices.cli._demo_image`): this
machine's bash, Python and pytest, and ``/repo`` with a failing test. The
episode's session has the image as its root and starts in its ``WorkingDir``
(``/repo``); it runs the image's pytest (1 failed), fixes the root-owned file
with ``str_replace``, runs pytest again (1 passed), checks the fix with its
``python`` tool (the image's python3 in the same session: it sees the edited
file and imports the image's pytest) and answers.
"""

from __future__ import annotations

import subprocess
import tempfile
import time
from typing import TextIO

from toolservices.cli._demo_shell import hermes_calls, play

__all__ = ["run_image_demo"]

_PYTEST = "python3 -m pytest -q"
#: The python tool's check: the edited file, the image's interpreter and its pytest.
_CHECK = (
    "import os, sys, pytest\nsys.path.insert(0, os.getcwd())\nfrom calc import add\n"
    "print(f'add(2, 3) = {add(2, 3)} in {os.getcwd()}, python3 {sys.version.split()[0]}, "
    "pytest {pytest.__version__}')"
)

#: The model's turns; the last one answers.
TURNS = [
    "Let me see where I am and run the repository's tests.\n"
    + hermes_calls(("bash", {"command": f"pwd && {_PYTEST}"})),
    "add() subtracts. Fixing it in the repository.\n"
    + hermes_calls(
        ("str_replace", {"path": "/repo/calc.py", "old_str": "a - b", "new_str": "a + b"})
    ),
    hermes_calls(("bash", {"command": _PYTEST})),
    "And from Python, in the same environment:\n" + hermes_calls(("python", {"code": _CHECK})),
    "Fixed: add() adds, and the repository's test passes with the image's pytest.",
]
#: What the tool results must show: the failing run in /repo, the passing one, Python's view.
EXPECT = {0: "1 failed", 2: "1 passed", 3: "add(2, 3) = 5"}


async def run_image_demo(out: TextIO) -> bool:
    """Build the image, play the scenario on it; whether it went as scripted. A machine
    where image sessions cannot run gets one line saying why (and counts as fine)."""
    from toolservices.cli._demo_image import build_image
    from toolservices.errors import SandboxUnavailableError
    from toolservices.images import ImageError
    from toolservices.shell import ShellService

    print("\nimage scenario (a task image: its repository, its python3 and pytest):", file=out)
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="toolservices-demo-") as tmp:
        try:
            reference = build_image(f"{tmp}/image")
        # no ldd, no pytest (or a package it needs), an unreadable file, a broken interpreter
        except (OSError, ValueError, ImportError, subprocess.SubprocessError) as exc:
            print(f"  skipped: cannot build the demo's image here ({exc})", file=out)
            return True
        built = time.perf_counter() - started
        try:
            shell = ShellService(
                pool_size=1, timeout=20.0, image=reference, image_cache=f"{tmp}/cache"
            )
        except (SandboxUnavailableError, ImageError) as exc:
            print(f"  skipped: image sessions are not available here ({exc})", file=out)
            return True
        try:
            namespaces = shell.isolation_report()["layers"]["session_namespaces"]
            if not namespaces.get("active"):
                print(
                    "  skipped: image sessions need session namespaces, which this machine "
                    f"does not allow ({namespaces.get('why') or namespaces})",
                    file=out,
                )
                return True
            ready = time.perf_counter() - started
            print(
                f"  image built in {built:.2f} s, pulled and the service up in {ready:.2f} s",
                file=out,
            )
            problems, summary = await play(shell, TURNS, EXPECT, out, python=True)
        finally:
            await shell.aclose()
    wall = time.perf_counter() - started
    status = "ok" if not problems else "FAILED: " + "; ".join(problems)
    print(f"image episode: {status} ({summary}, {wall:.2f} s in all)", file=out)
    return not problems
