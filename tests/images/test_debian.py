"""A real distribution as the root: Debian (python3, pytest, pip, git) made by mmdebstrap.

The episode of the issue's demo: a repository shipped in the image, with a bug and its
tests; the session runs the image's pytest, fixes the root-owned file, installs the
package into the image's system site-packages with pip, commits with git. The rootfs tar
is made by ``.ci/run`` (mmdebstrap from Debian's packages, cached between runs) at
``$TOOLSERVICES_TEST_ROOTFS`` or ``~/.cache/toolservices-tests/debian-bookworm-python.tar``.
"""

from __future__ import annotations

import os
import tarfile
from collections.abc import Iterator

import pytest
from _build import Entry, Layer, oci_layout_from_rootfs

from toolservices.shell import ShellService

ROOTFS = os.environ.get("TOOLSERVICES_TEST_ROOTFS") or os.path.expanduser(
    "~/.cache/toolservices-tests/debian-bookworm-python.tar"
)

_PYPROJECT = b"""[build-system]
requires = ["setuptools"]
build-backend = "setuptools.build_meta"

[project]
name = "mathx"
version = "0.1"

[tool.pytest.ini_options]
pythonpath = ["src"]
"""
_CODE = b"def add(a, b):\n    return a - b\n"
_TEST = b"from mathx import add\n\n\ndef test_add():\n    assert add(2, 3) == 5\n"


def task_layer() -> Layer:
    d = tarfile.DIRTYPE
    return Layer(
        [
            Entry("repo/", kind=d, mode=0o755),
            Entry("repo/pyproject.toml", _PYPROJECT),
            Entry("repo/src/", kind=d, mode=0o755),
            Entry("repo/src/mathx/", kind=d, mode=0o755),
            Entry("repo/src/mathx/__init__.py", _CODE),
            Entry("repo/tests/", kind=d, mode=0o755),
            Entry("repo/tests/test_mathx.py", _TEST),
        ],
        "gzip",
    )


@pytest.fixture(scope="module")
def debian_image(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str]:
    """The Debian image with the task's layer: its reference and the cache it is pulled to."""
    if not os.path.exists(ROOTFS):
        pytest.skip(
            f"no Debian rootfs at {ROOTFS}: .ci/run makes it with mmdebstrap "
            "(or set TOOLSERVICES_TEST_ROOTFS to a rootfs tar with python3, pytest, pip, git)"
        )
    root = tmp_path_factory.mktemp("debian")
    oci_layout_from_rootfs(str(root / "oci"), ROOTFS, [task_layer()])
    return f"oci:{root}/oci", str(root / "cache")


@pytest.fixture(scope="module")
def debian(debian_image: tuple[str, str]) -> Iterator[ShellService]:
    reference, cache = debian_image
    with ShellService(
        pool_size=2,
        timeout=50.0,
        max_sessions=8,
        image=reference,
        image_cache=cache,
        disk_quota=256 << 20,
    ) as shell:
        yield shell


@pytest.mark.timeout(120)  # pip and pytest in a real distribution: seconds each
def test_fix_install_and_test_a_repository_shipped_in_the_image(debian: ShellService) -> None:
    sid = "episode"
    first = debian.run(
        "cat /etc/os-release | head -1; cd /repo && python3 -m pytest -q", session_id=sid
    )
    assert 'PRETTY_NAME="Debian GNU/Linux 12' in first.stdout, first
    assert first.returncode == 1 and "1 failed" in first.stdout, first
    debian.write_file(
        "/repo/src/mathx/__init__.py", "def add(a, b):\n    return a + b\n", session_id=sid
    )
    fixed = debian.run("python3 -m pytest -q", session_id=sid)
    assert fixed.returncode == 0 and "1 passed" in fixed.stdout, fixed
    install = debian.run(
        "pip install -q --no-index --no-build-isolation --break-system-packages /repo && "
        "cd /tmp && python3 -c 'import mathx, sys; print(mathx.add(2, 3), mathx.__file__)'",
        session_id=sid,
    )
    assert install.returncode == 0, install
    assert install.stdout.startswith("5 /usr/local/lib/python3"), install
    commit = debian.run(
        "cd /repo && git init -q && git add -A && "
        "git -c user.name=t -c user.email=t@example.com commit -qm fix && "
        "git log --oneline | wc -l",
        session_id=sid,
    )
    assert commit.stdout.strip() == "1", commit
    other = debian.run(
        "cd /repo && python3 -m pytest -q; python3 -c 'import mathx'", session_id="other"
    )
    assert "1 failed" in other.stdout and "ModuleNotFoundError" in other.stderr, other


def test_commands_run_on_the_live_bash_of_debians_own_bash(debian: ShellService) -> None:
    """Debian 12's bash (5.2, glibc 2.36) loads the package's builtin from the preloaded
    bytes: the session's commands are copies of one live bash, as on the host root."""
    from toolservices.shell._native import library

    if library() is None:
        pytest.skip("the package's bash builtin is not built here (no C compiler)")
    count = "for p in /proc/[0-9]*; do cat $p/comm; done 2>/dev/null | grep -cx ts-shell"
    res = debian.run(f"Y=2; {count}", session_id="live-debian")
    assert res.stdout == "1\n", res
    assert debian.run('echo "$Y"', session_id="live-debian").stdout == "2\n"


def test_python_sessions_run_on_the_image_python(debian_image: tuple[str, str]) -> None:
    """PythonExecutorService(image=...): Debian's own python3 (not the host's), its
    packages importable, the image's root writable and private to each session."""
    import sys

    from toolservices.python import PythonExecutorService

    reference, cache = debian_image
    with PythonExecutorService(pool_size=2, image=reference, image_cache=cache) as python:
        first = python.execute(
            "import os, sys, pytest, pip\n"
            "print(sys.executable, sys.version.split()[0], os.getuid())\n"
            "print(pytest.__file__)\n"
            "print(open('/etc/os-release').readline().strip())\n"
            "open('/usr/lib/python3/dist-packages/mine.py', 'w').write('X = 5\\n')\n"
            "import mine; print(mine.X)",
            session_id="a",
        )
        assert first.success, first
        exe, version, uid = first.stdout.split("\n")[0].split()
        assert exe == "/usr/bin/python3" and uid == "0", first.stdout
        assert version != sys.version.split()[0] or sys.executable != exe  # not the host's
        assert first.stdout.split("\n")[1:4] == [
            "/usr/lib/python3/dist-packages/pytest/__init__.py",
            'PRETTY_NAME="Debian GNU/Linux 12 (bookworm)"',
            "5",
        ], first.stdout
        assert python.execute("print(mine.X * 2)", session_id="a").stdout == "10\n"
        other = python.execute(
            "import importlib.util as u; print(u.find_spec('mine'))", session_id="b"
        )
        assert other.stdout == "None\n", other  # the other session's root never changed
        fresh = python.execute("import sys; print(sys.executable)")  # a fresh interpreter
        assert fresh.stdout == "/usr/bin/python3\n", fresh
