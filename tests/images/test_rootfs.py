"""An image as a root: overlayfs over the cache's layers in a user namespace, pivot_root.

The mechanism the session set-up will call (runtime/_rootfs.py), run for real in a
child process: real layers from the cache, real overlayfs, real namespaces.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from _build import Entry, Layer, busybox_layer, oci_layout

from toolservices.images import ImageStore
from toolservices.python.runtime._linux import SetupError
from toolservices.python.runtime._rootfs import overlay_options

_HELPER = os.path.join(os.path.dirname(__file__), "_enter_root.py")
_USER = 65534  # as root, the test plays a user whose own cache it is


def _run(
    image_layers: tuple[str, ...], tmp_path: Path, command: str, quota: int = 8 << 20
) -> subprocess.CompletedProcess[str]:
    upper = tmp_path / "upper"
    upper.mkdir()
    spec = {
        "lowerdirs": list(reversed(image_layers)),
        "upper": str(upper),
        "quota": quota,
        "uid": _USER if os.getuid() == 0 else None,
        "command": command,
    }
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": os.pathsep.join(sys.path)}
    return subprocess.run(
        [sys.executable, _HELPER, json.dumps(spec)],
        capture_output=True,
        text=True,
        timeout=30,
        env=env,
        check=False,
    )


@pytest.fixture
def tmp_path(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A directory the test's user can reach (pytest's own are root's, mode 0700)."""
    path = Path(tempfile.mkdtemp(prefix="ts-rootfs-", dir="/tmp"))
    os.chmod(path, 0o755)
    try:
        yield path
    finally:
        shutil.rmtree(path)


@pytest.fixture
def image(tmp_path: Path) -> tuple[str, ...]:
    top = Layer(
        [
            Entry("etc/.wh.os-release"),
            Entry("opt/", kind=tarfile.DIRTYPE),
            Entry("opt/tool", b"v2"),
        ],
        "zstd",
    )
    oci_layout(str(tmp_path / "oci"), [busybox_layer("gzip"), top])
    cache = tmp_path / "cache"
    layers = ImageStore(str(cache)).pull(f"oci:{tmp_path}/oci").layers
    if os.getuid() == 0:
        subprocess.run(["chown", "-R", f"{_USER}:{_USER}", str(cache)], check=True)
    return layers


def test_session_is_root_of_its_image_and_changes_stay_private(
    image: tuple[str, ...], tmp_path: Path
) -> None:
    script = (
        "id -u; cat /repo/task.txt; echo fixed > /repo/task.txt && cat /repo/task.txt; "
        "test -e /etc/os-release || echo whiteout-honoured; cat /opt/tool; echo; "
        "rm /bin/true && echo rm-ok; mkdir -p /usr/lib/site && echo pkg > /usr/lib/site/m.py "
        "&& echo install-ok; ls /"
    )
    result = _run(image, tmp_path, script)
    if "userxattr" in result.stderr or "Operation not permitted" in result.stderr:
        pytest.skip(f"overlayfs in a user namespace is not available here: {result.stderr}")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.split("\n")
    assert lines[:6] == ["0", "fix me", "fixed", "whiteout-honoured", "v2", "rm-ok"], lines
    assert "install-ok" in lines
    assert {"bin", "etc", "repo", "proc", "dev", "opt"} <= set(lines[7].split()) | set(lines[7:])
    # The cache is untouched: the writes went to the private layer, gone with the tmpfs.
    assert (Path(image[0]) / "repo/task.txt").read_text() == "fix me\n"
    assert (Path(image[0]) / "bin/true").is_symlink()
    assert not (Path(image[0]) / "usr").exists()


def test_writable_layer_is_inside_the_quota(image: tuple[str, ...], tmp_path: Path) -> None:
    result = _run(
        image, tmp_path, "cat /bin/busybox /bin/busybox > /repo/big; echo rc=$?", quota=1 << 20
    )
    if "Operation not permitted" in result.stderr:
        pytest.skip(f"overlayfs in a user namespace is not available here: {result.stderr}")
    assert "rc=1" in result.stdout and "No space left" in result.stderr, result


def test_overlay_options_are_relative_to_the_cache_and_bounded() -> None:
    base, options = overlay_options(["/c/layers/bb", "/c/layers/aa"], "/u/up", "/u/work")
    assert base == "/c/layers"
    assert options == "lowerdir=bb:aa,upperdir=/u/up,workdir=/u/work,userxattr"
    layers = [f"/c/layers/{i:064x}" for i in range(70)]
    with pytest.raises(SetupError, match="too many layers"):
        overlay_options(layers, "/u/up", "/u/work")
    with pytest.raises(SetupError, match="cannot be used by overlayfs"):
        overlay_options(["/a/x:y", "/b/z"], "/u", "/w")
