"""Build hook (hatchling): compiles the shell's bash builtin into the wheel.

``src/toolservices/shell/_tsbash.c`` becomes ``_tsbash.so`` beside it, which
shell sessions load into their bash to serve commands from one live bash
(docs/shell.md, "Speed and memory"). It needs a C compiler (``$CC``, else
``cc``) and nothing else: no Python or bash headers. Without a compiler, or
if it fails, the wheel is pure Python and sessions start a bash per command,
as they did before (the same guarantees, slower). ``python hatch_build.py``
builds it in place (a checkout used without installing).
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
import sysconfig
from typing import Any

SOURCE = os.path.join("src", "toolservices", "shell", "_tsbash.c")
TARGET = os.path.join("src", "toolservices", "shell", "_tsbash.so")


def build(root: str) -> bool:
    """Compile the builtin under ``root``; False (with a note on stderr) when it cannot be."""
    if not sys.platform.startswith("linux"):
        return False
    compiler = shlex.split(os.environ.get("CC", "")) or [shutil.which("cc") or "cc"]
    if shutil.which(compiler[0]) is None:
        print("toolservices: no C compiler: the shell's bash builtin is not built", file=sys.stderr)
        return False
    command = [
        *compiler,
        "-O2",
        "-shared",
        "-fPIC",
        "-Wall",
        "-Werror=implicit-function-declaration",
        "-o",
        os.path.join(root, TARGET),
        os.path.join(root, SOURCE),
    ]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        print(
            f"toolservices: the shell's bash builtin did not build:\n{done.stderr}", file=sys.stderr
        )
        return False
    return True


try:
    from hatchling.builders.hooks.plugin.interface import BuildHookInterface
except ImportError:  # run as a script, or read by a tool without hatchling
    BuildHookInterface = object  # type: ignore[assignment,misc]


class CustomBuildHook(BuildHookInterface):  # type: ignore[misc,valid-type]
    """Builds the builtin for wheels (editable ones too); the sdist carries its source."""

    def initialize(self, version: str, build_data: dict[str, Any]) -> None:
        if self.target_name != "wheel" or not build(self.root):
            return
        build_data["pure_python"] = False
        # a plain shared object for bash, no Python ABI in it: any CPython 3 on this platform
        platform = sysconfig.get_platform().replace("-", "_").replace(".", "_")
        build_data["tag"] = f"py3-none-{platform}"
        build_data["artifacts"].append(TARGET)


if __name__ == "__main__":
    sys.exit(0 if build(os.path.dirname(os.path.abspath(__file__))) else 1)
