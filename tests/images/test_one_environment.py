"""One environment for an episode's Python and shell tools, on an image.

``ShellService(image=...).run_python`` (and ``python_tool(shell=...)``) runs the
code in the image's own python3, inside the shell session: the image's
packages import, and a file either tool writes (in the workspace or anywhere in
the root) is the file the other sees. Images without a usable python3 keep
their shell tool; the Python tool says why it cannot run.
"""

from __future__ import annotations

import tarfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from _build import Entry, Layer, bash_layer, busybox_layer, oci_layout
from test_debian import debian_image  # noqa: F401 - the module's fixture, shared here

from toolservices import Episode, python_tool, shell_tools
from toolservices.shell import ShellService


@pytest.fixture(scope="module")
def debian(debian_image: tuple[str, str]) -> Iterator[ShellService]:  # noqa: F811
    reference, cache = debian_image
    with ShellService(
        pool_size=2, timeout=50.0, max_sessions=8, image=reference, image_cache=cache
    ) as shell:
        if not shell.isolation_report()["layers"]["session_namespaces"]["active"]:
            pytest.skip("no session namespaces here")
        yield shell


@pytest.mark.timeout(120)  # pytest in a real distribution: seconds
def test_the_python_tool_runs_the_images_python_in_the_shells_root(debian: ShellService) -> None:
    sid = "root"
    first = debian.run_python(
        "import os, sys, pytest\n"
        "print(sys.executable, sys.version_info >= (3, 10), os.getcwd())\n"
        "print(pytest.__file__)\n"
        "print(open('/etc/os-release').readline().strip())",
        session_id=sid,
    )
    assert first.success, first
    lines = first.stdout.splitlines()
    assert lines[0] == "/usr/bin/python3 True /repo", first  # the image's WorkingDir, as bash
    assert lines[1].startswith("/usr/lib/python3/dist-packages/pytest"), first
    assert lines[2] == 'PRETTY_NAME="Debian GNU/Linux 12 (bookworm)"', first
    # Python fixes the root-owned task file; bash runs the image's pytest on it
    fixed = debian.run_python(
        "path = '/repo/src/mathx/__init__.py'\n"
        "code = open(path).read()\n"
        "open(path, 'w').write(code.replace('a - b', 'a + b'))",
        session_id=sid,
    )
    assert fixed.success, fixed
    tests = debian.run("python3 -m pytest -q", session_id=sid)
    assert tests.returncode == 0 and "1 passed" in tests.stdout, tests.stdout
    # bash installs into the image's site-packages; Python imports it
    installed = debian.run(
        "mkdir -p /usr/local/lib/python3.11/dist-packages && "
        "echo 'VALUE = 7' > /usr/local/lib/python3.11/dist-packages/fromsh.py",
        session_id=sid,
    )
    assert installed.returncode == 0, installed
    seen = debian.run_python("import fromsh\nprint(fromsh.VALUE)", session_id=sid)
    assert seen.stdout == "7\n", seen
    # pytest in-process, in the Python tool
    ran = debian.run_python(
        "import pytest\nprint(pytest.main(['-q', '-p', 'no:cacheprovider', '/repo/tests']))",
        session_id=sid,
    )
    assert ran.stdout.strip().endswith("0"), ran
    other = debian.run_python(
        "import os\nprint(os.path.exists('/usr/local/lib/python3.11/dist-packages/fromsh.py'))",
        session_id="other",
    )
    assert other.stdout == "False\n", other  # another session has its own writable layer
    for session in (sid, "other"):
        debian.close_session(session)


def test_loopback_timeout_and_fork_on_the_image(debian: ShellService) -> None:
    sid = "net"
    layer = debian.isolation_report()["layers"]["network"]
    if "loopback" in layer.get("detail", "") and layer["active"]:
        debian.write_file(
            "/tmp/server.py",
            "import socket\ns = socket.socket(); s.bind(('127.0.0.1', 0)); s.listen()\n"
            "open('/tmp/ready', 'w').write(str(s.getsockname()[1]) + '\\n')\n"
            "while True:\n    c, _ = s.accept(); c.sendall(b'hi\\n'); c.close()\n",
            session_id=sid,
        )
        port = debian.run(
            "mkfifo /tmp/ready && (python3 /tmp/server.py >/dev/null 2>&1 &) && "
            "read port < /tmp/ready && echo $port",
            session_id=sid,
        )
        talk = debian.run_python(
            f"import socket\nprint(socket.create_connection(('127.0.0.1', {int(port.stdout)}), "
            "timeout=5).recv(10).decode(), end='')",
            session_id=sid,
        )
        assert talk.stdout == "hi\n", talk
    debian.run_python("kept = 1", session_id=sid)
    slow = debian.run_python("import time\ntime.sleep(60)", session_id=sid, timeout=1.0)
    assert slow.timed_out and slow.restarted, slow
    assert debian.run("echo alive", session_id=sid).stdout == "alive\n"
    debian.run_python("x = 3\nopen('/opt/made.txt', 'w').write('m')", session_id=sid)
    [copy] = debian.fork_session(sid, 1)
    try:
        res = debian.run_python(
            "import sys\nprint(sys.executable, open('/opt/made.txt').read(), 'x' in globals())",
            session_id=copy,
        )
        assert (res.stdout, res.restarted) == ("/usr/bin/python3 m False\n", True), res
    finally:
        debian.close_session(copy)
        debian.close_session(sid)


async def test_an_episode_with_both_tools_on_the_image(debian: ShellService) -> None:
    tools = [python_tool(shell=debian), *shell_tools(debian)]
    async with Episode(tools, max_turns=None) as episode:
        from tests._chat import hermes

        await episode.astep(
            hermes(
                "python",
                {"code": "import pytest\nopen('/repo/v.txt', 'w').write(pytest.__version__)"},
            )
        )
        messages = await episode.astep(hermes("bash", {"command": "cat /repo/v.txt"}))
        version = messages[-1]["content"]
        assert version and version[0].isdigit(), messages


def test_the_demo_images_python_in_a_shell_session(tmp_path: Path) -> None:
    """Without the Debian rootfs too: the demo's image (this machine's Python and pytest)."""
    from toolservices.cli._demo_image import build_image

    reference = build_image(str(tmp_path / "oci"))
    with ShellService(pool_size=1, image=reference, image_cache=str(tmp_path / "c")) as sh:
        if not sh.isolation_report()["layers"]["session_namespaces"]["active"]:
            pytest.skip("no session namespaces here")
        sh.run("echo 'VALUE = 3' > /repo/fromsh.py", session_id="a")
        res = sh.run_python(
            "import os, sys, pytest\n"
            "print(sys.executable, os.getcwd(), pytest.__file__.startswith(sys.prefix))\n"
            "try:\n    import fromsh\nexcept ImportError:\n    print('not on sys.path')\n"
            "sys.path.insert(0, os.getcwd())\nimport fromsh\nprint(fromsh.VALUE)",
            session_id="a",
        )
        # as in the executor's sessions, the working directory is not on sys.path
        assert res.stdout == "/usr/local/bin/python3 /repo True\nnot on sys.path\n3\n", res


def _image(tmp_path: Path, extra: list[Entry]) -> str:
    layers = [busybox_layer("gzip"), bash_layer("gzip")]
    if extra:
        layers.append(Layer(extra, "gzip"))
    oci_layout(str(tmp_path / "oci"), layers, workdir="/")
    return f"oci:{tmp_path / 'oci'}"


def test_an_image_without_python_keeps_its_shell(tmp_path: Path) -> None:
    with ShellService(
        pool_size=1, image=_image(tmp_path, []), image_cache=str(tmp_path / "c")
    ) as sh:
        res = sh.run_python("print(1)", session_id="a")
        assert not res.success and res.exception is not None, res
        assert res.exception.type == "PythonUnavailable"
        assert "no python3 on its PATH" in res.stderr and "bash" in res.stderr, res
        assert sh.run("echo still here", session_id="a").stdout == "still here\n"


def test_an_unusable_python_is_a_clear_error(tmp_path: Path) -> None:
    """A python3 that ends at once (as one older than 3.10 does, saying so): the tool says so."""
    fake = Entry(
        "usr/bin/python3", b"#!/bin/bash\necho 'Python 3.8.10 here' >&2\nexit 1\n", mode=0o755
    )
    folders = [
        Entry("usr/", kind=tarfile.DIRTYPE, mode=0o755),
        Entry("usr/bin/", kind=tarfile.DIRTYPE, mode=0o755),
    ]
    reference = _image(tmp_path, [*folders, fake])
    with ShellService(pool_size=1, image=reference, image_cache=str(tmp_path / "c")) as sh:
        res = sh.run_python("print(1)", session_id="a")
        assert not res.success and res.exception is not None, res
        assert res.exception.type == "PythonUnavailable", res
        assert "/usr/bin/python3 ended before it could serve the python tool" in res.stderr, res
        assert "Python 3.8.10 here" in res.stderr and "3.10 or newer" in res.stderr, res
        assert sh.run("echo still here", session_id="a").stdout == "still here\n"
        assert not sh.run_python("print(1)", session_id="a").success  # and again, as clearly


def test_a_python_that_never_serves_is_bounded_by_the_calls_limit(tmp_path: Path) -> None:
    """Starting counts against the call's limit: a python3 that hangs (and its child) is
    killed when it is up, and the shell session goes on."""
    fake = Entry("usr/bin/python3", b"#!/bin/bash\nsleep 300 &\nwait\n", mode=0o755)
    folders = [
        Entry("usr/", kind=tarfile.DIRTYPE, mode=0o755),
        Entry("usr/bin/", kind=tarfile.DIRTYPE, mode=0o755),
    ]
    reference = _image(tmp_path, [*folders, fake])
    with ShellService(pool_size=1, image=reference, image_cache=str(tmp_path / "c")) as sh:
        res = sh.run_python("print(1)", session_id="a", timeout=1.0)
        assert res.exception is not None and res.exception.type == "PythonUnavailable", res
        assert "did not start within the call's time limit" in res.stderr, res
        left = sh.run("ps -eo comm | grep -c -x sleep", session_id="a")
        assert left.stdout == "0\n", left  # the hanging start and its child are gone
