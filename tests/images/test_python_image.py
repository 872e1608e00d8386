"""PythonExecutorService(image=...): sessions run the image's own python3 in its root.

The image is the demo's (built here from this machine's bash, base Python and pytest:
``toolservices.cli._demo_image``); the Debian one is in test_debian.py.
"""

from __future__ import annotations

import os
import pickle
import tarfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from _build import Entry, Layer, bash_layer, busybox_layer, oci_layout

from toolservices.errors import InfrastructureError, UserError
from toolservices.python import PythonExecutorService


@pytest.fixture(scope="module")
def image(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str]:
    from toolservices.cli._demo_image import build_image

    root = tmp_path_factory.mktemp("python-image")
    return build_image(str(root / "oci")), str(root / "cache")


@pytest.fixture(scope="module")
def python(image: tuple[str, str]) -> Iterator[PythonExecutorService]:
    with PythonExecutorService(pool_size=2, image=image[0], image_cache=image[1]) as service:
        if not service.isolation_report()["layers"]["session_namespaces"]["active"]:
            pytest.skip("no session namespaces here")
        yield service


def test_sessions_run_the_images_python_and_packages(python: PythonExecutorService) -> None:
    result = python.execute(
        "import os, sys, pytest\n"
        "print(sys.executable, os.getuid(), open('/etc/os-release').readline().strip())\n"
        "print(pytest.__file__.startswith(sys.base_prefix))\n"
        "try:\n    import anyio\nexcept ImportError:\n    print('no host packages')\n"
        "x = 41",
        session_id="a",
    )
    assert result.success, result
    assert result.stdout == (
        "/usr/local/bin/python3 0 ID=toolservices-demo\nTrue\nno host packages\n"
    ), result
    assert python.execute("print(x + 1)", session_id="a").stdout == "42\n"
    assert python.execute("import sys; print(sys.executable)").stdout == "/usr/local/bin/python3\n"


def test_the_runtime_archive_is_sealed_and_not_left_open(python: PythonExecutorService) -> None:
    """Every image session is started from one memfd: none keeps it, none could change it."""
    probe = python.execute(
        "import os\nlinks = []\nfor n in os.listdir('/proc/self/fd'):\n"
        "    try:\n        links.append(os.readlink('/proc/self/fd/' + n))\n"
        "    except OSError:\n        pass  # the listing's own descriptor\n"
        "print([x for x in links if 'toolservices-runtime' in x], len(links) > 2)",
        session_id="fds",
    )
    assert probe.stdout == "[] True\n", probe
    from toolservices.python.runtime import _imagepy

    fd = _imagepy.runtime_zip()
    try:
        with pytest.raises(PermissionError):
            os.pwrite(fd, b"x", 0)
    finally:
        os.close(fd)


def test_the_root_is_writable_and_private(python: PythonExecutorService) -> None:
    wrote = python.execute("open('/repo/calc.py', 'a').write('# mine\\n')", session_id="w1")
    assert wrote.success, wrote
    other = python.execute("print(open('/repo/calc.py').read().count('mine'))", session_id="w2")
    assert other.stdout == "0\n", other


def test_spawn_with_files_copies_the_root_and_fork_session_is_refused(
    python: PythonExecutorService,
) -> None:
    made = python.execute(
        "import os\nopen('/repo/new.txt', 'w').write('src')\nopen('ws.txt', 'w').write('w')\n"
        "print(os.getcwd())",
        session_id="src",
    )
    assert made.stdout == "/workspace\n", made
    with pytest.raises(UserError, match="use spawn_with_files"):
        python.fork_session("src", 1)
    (copy,) = python.spawn_with_files("src", 1)
    seen = python.execute(
        "print(open('/repo/new.txt').read(), open('ws.txt').read())", session_id=copy
    )
    assert seen.stdout == "src w\n", seen
    python.execute("open('/repo/new.txt', 'w').write('copy')", session_id=copy)
    assert python.execute("print(open('/repo/new.txt').read())", session_id="src").stdout == "src\n"


def test_a_timeout_kills_and_the_next_call_restarts_on_the_image(
    python: PythonExecutorService,
) -> None:
    python.execute("y = 1", session_id="t")
    stuck = python.execute("while True:\n    pass", session_id="t", timeout=1.0)
    assert stuck.timed_out and stuck.restarted and not stuck.success, stuck
    after = python.execute("import sys\nprint('y' in dir(), sys.executable)", session_id="t")
    assert after.stdout == "False /usr/local/bin/python3\n", after  # a fresh one


def test_the_image_travels_by_name(python: PythonExecutorService) -> None:
    copy = pickle.loads(pickle.dumps(python))  # as Ray rebuilds a replica: pulled again
    try:
        assert copy.image is not None and python.image is not None
        assert copy.image.digest == python.image.digest
        assert copy.execute("import sys; print(sys.executable)").stdout == (
            "/usr/local/bin/python3\n"
        )
    finally:
        copy.close()


def test_an_image_without_python3_is_refused(tmp_path: Path) -> None:
    oci_layout(str(tmp_path / "oci"), [busybox_layer("gzip"), bash_layer("zstd")])
    with pytest.raises(UserError, match="has no python3 on its PATH"):
        PythonExecutorService(image=f"oci:{tmp_path}/oci", image_cache=str(tmp_path / "cache"))


def test_a_python3_that_does_not_serve_says_so(tmp_path: Path) -> None:
    """Something named python3 that is no CPython >= 3.10 (here a script): a clear error."""
    d = tarfile.DIRTYPE
    fake = Layer(
        [
            Entry("usr/", kind=d, mode=0o755),
            Entry("usr/bin/", kind=d, mode=0o755),
            Entry("usr/bin/python3", b"#!/bin/sh\nexit 3\n", mode=0o755),
        ]
    )
    oci_layout(str(tmp_path / "oci"), [busybox_layer("gzip"), fake], env=("PATH=/usr/bin:/bin",))
    with (
        PythonExecutorService(
            pool_size=1, spares=0, image=f"oci:{tmp_path}/oci", image_cache=str(tmp_path / "cache")
        ) as service,
        pytest.raises(InfrastructureError, match="image's /usr/bin/python3 ended before"),
    ):
        service.execute("print(1)", session_id="s")
