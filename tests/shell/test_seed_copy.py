"""The seed copy itself (runtime/_seed.py), on plain directories: what it keeps, what it skips,
and that it never follows a symlink, whichever number of copying processes."""

from __future__ import annotations

import dataclasses
import os
import stat
from pathlib import Path

import pytest

from toolservices.errors import UserError
from toolservices.python import PythonExecutorService
from toolservices.python.runtime import remove_tree
from toolservices.python.runtime._seed import copy_into
from toolservices.python.sandbox import default_config


def _tree(root: Path, outside: Path) -> None:
    (root / "d" / "e").mkdir(parents=True)
    (root / "d" / "e" / "f.txt").write_text("deep")
    (root / "big").write_bytes(os.urandom(3 << 20))
    (root / "run.sh").write_text("#!/bin/sh\n")
    (root / "run.sh").chmod(0o751)
    os.link(root / "big", root / "d" / "big-link")
    (root / "esc").symlink_to(outside)
    (root / "escdir").symlink_to(outside.parent)
    os.mkfifo(root / "fifo")
    with open(root / "sparse", "wb") as fh:
        fh.seek(32 << 20)
        fh.write(b"tail")
    os.utime(root / "d" / "e" / "f.txt", ns=(10**18, 10**18))
    deep = root / "deep"
    deep.mkdir()
    fd = os.open(deep, os.O_RDONLY | os.O_DIRECTORY)
    for _ in range(300):  # deeper than one path can name from the root at once
        os.mkdir("x" * 40, dir_fd=fd)
        nxt = os.open("x" * 40, os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
        os.close(fd)
        fd = nxt
    os.close(os.open("bottom", os.O_CREAT | os.O_WRONLY, 0o600, dir_fd=fd))
    os.close(fd)
    (root / "ro").mkdir()
    (root / "ro" / "in").write_text("x")
    (root / "ro").chmod(0o500)


@pytest.mark.parametrize("workers", [1, 2])
def test_copy_into_keeps_the_tree_and_follows_no_symlink(tmp_path: Path, workers: int) -> None:
    src, dst, outside = tmp_path / "src", tmp_path / "dst", tmp_path / "outside"
    src.mkdir()
    dst.mkdir()
    outside.write_text("not to be copied")
    _tree(src, outside)
    fd = os.open(src, os.O_RDONLY | os.O_DIRECTORY)
    try:
        copy_into(fd, str(dst), workers=workers)
    finally:
        os.close(fd)
        (src / "ro").chmod(0o700)
    assert (dst / "d" / "e" / "f.txt").read_text() == "deep"
    assert (dst / "d" / "e" / "f.txt").stat().st_mtime_ns == 10**18
    assert (dst / "big").read_bytes() == (src / "big").read_bytes()
    assert (dst / "big").stat().st_ino == (dst / "d" / "big-link").stat().st_ino
    assert stat.S_IMODE((dst / "run.sh").stat().st_mode) == 0o751
    assert os.readlink(dst / "esc") == str(outside) and (dst / "esc").is_symlink()
    assert (dst / "escdir").is_symlink() and os.readlink(dst / "escdir") == str(tmp_path)
    assert not (dst / "fifo").exists()
    sparse = (dst / "sparse").stat()
    assert sparse.st_size == (32 << 20) + 4 and sparse.st_blocks * 512 < (1 << 20)
    assert (dst / "sparse").read_bytes()[-5:] == b"\0tail"
    assert stat.S_IMODE((dst / "ro").stat().st_mode) == 0o500
    (dst / "ro").chmod(0o700)
    assert (dst / "ro" / "in").read_text() == "x"
    fd = os.open(dst / "deep", os.O_RDONLY | os.O_DIRECTORY)
    for _ in range(300):
        nxt = os.open("x" * 40, os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
        os.close(fd)
        fd = nxt
    assert os.listdir(fd) == ["bottom"]
    os.close(fd)
    remove_tree(str(src / "deep"))  # (deeper than pytest's clean-up can name)
    remove_tree(str(dst / "deep"))
    # nothing of what the links point to was copied in their place
    copied = {p.name for p in dst.rglob("*") if not p.is_symlink() and p.is_file()}
    assert "outside" not in copied


@pytest.mark.parametrize("quota", [None, 8 << 20], ids=["no-quota", "quota"])
def test_spawn_with_files_of_a_python_session(quota: int | None) -> None:
    """The Python executor's route: no fixed workspace, so the source's own path, opened in
    its namespaces through a pidfd of its (dumpable) interpreter."""
    config = dataclasses.replace(default_config(), disk_quota=quota)
    with PythonExecutorService(pool_size=1, timeout=10.0, sandbox=config) as py:
        code = "open('f', 'w').write('v1'); import os; os.symlink('/etc', 'e'); x = 1"
        assert py.execute(code, session_id="src").success
        (copy,) = py.spawn_with_files("src", 1)
        res = py.execute(
            "import os; print(open('f').read(), os.readlink('e'), 'x' in globals())",
            session_id=copy,
        )
        assert res.stdout == "v1 /etc False\n", res  # files only: no memory
        assert py.execute("open('f', 'w').write('v2')", session_id=copy).success
        assert py.execute("print(open('f').read())", session_id="src").stdout == "v1\n"
        with pytest.raises(UserError):
            py.spawn_with_files("never-was", 1)


def test_a_symlink_planted_on_the_path_to_the_source_is_not_followed() -> None:
    """Without bwrap the session may write the parent of its lineage (its own /dev/shm):
    a symlink put there must not lead the copy, made outside the session's Landlock, to a
    host directory the session cannot read."""
    import shutil
    import tempfile

    from toolservices.errors import InfrastructureError

    secret_top = Path(tempfile.mkdtemp(dir="/var/tmp"))
    try:
        (secret_top / "w0").mkdir()
        (secret_top / "w0" / "secret.txt").write_text("TOPSECRET")
        config = dataclasses.replace(default_config(), bwrap=False)
        with PythonExecutorService(pool_size=1, timeout=10.0, spares=0, sandbox=config) as py:
            read = py.execute(f"open('{secret_top}/w0/secret.txt').read()", session_id="src")
            if read.success:
                pytest.skip("no Landlock here: nothing is hidden from the session")
            plant = (
                "import os\nw0 = os.getcwd(); lin = os.path.dirname(w0); base = "
                "os.path.dirname(lin)\nos.chdir('/'); os.rename(base, base + '.old'); "
                f"os.mkdir(base); os.symlink({str(secret_top)!r}, lin)"
            )
            assert py.execute(plant, session_id="src").success
            with pytest.raises(InfrastructureError, match="symbolic links"):
                py.spawn_with_files("src", 1)
    finally:
        shutil.rmtree(secret_top)


def _chain(root: Path, depth: int, *, siblings: bool) -> None:
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    for level in range(depth):
        if siblings:  # a comb: every level has a second directory and a file
            os.mkdir(f"s{level}", dir_fd=fd)
            os.close(os.open(f"f{level}", os.O_CREAT | os.O_WRONLY, 0o600, dir_fd=fd))
        os.mkdir("d", dir_fd=fd)
        nxt = os.open("d", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
        os.close(fd)
        fd = nxt
    os.close(fd)


@pytest.mark.parametrize("siblings", [False, True], ids=["chain", "comb"])
def test_a_deep_tree_costs_path_lookups_linear_in_its_size(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, siblings: bool
) -> None:
    """Counted, not timed: the names the copy resolves, against the tree's entries."""
    from toolservices.python.runtime import _seed

    depth = 1500
    src, dst = tmp_path / "src", tmp_path / "dst"
    src.mkdir()
    dst.mkdir()
    _chain(src, depth, siblings=siblings)
    resolved = [0]
    real = _seed._open_chunk

    def counting(root: int, rel: str, flags: int, *, cross_mounts: bool = False) -> int:
        resolved[0] += rel.count("/") + 1
        return real(root, rel, flags, cross_mounts=cross_mounts)

    monkeypatch.setattr(_seed, "_open_chunk", counting)
    top = os.open(src, os.O_RDONLY | os.O_DIRECTORY)
    try:
        copy_into(top, str(dst), workers=1)
    finally:
        os.close(top)
    entries = depth * (3 if siblings else 1)
    assert resolved[0] < 40 * entries, resolved  # reopening from the top: ~depth**2 / 2
    fd = os.open(dst, os.O_RDONLY | os.O_DIRECTORY)
    for _ in range(depth):  # the whole chain arrived
        nxt = os.open("d", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
        os.close(fd)
        fd = nxt
    os.close(fd)
    remove_tree(str(dst))
    remove_tree(str(src))
