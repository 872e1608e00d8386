"""CodeJudge(image=...) and ``serve --sandbox-fusion --image``: submissions on an image's root.

Two real images (tests/images/_build.py): busybox-static with the host's bash (only
``bash`` available: everything else answers SandboxError naming what the image lacks),
and a Debian 12 rootfs with python3 and pytest made by mmdebstrap (``.ci/run`` builds it;
the tests that need it skip, saying so, without it): Python runs on the image's own
interpreter, through its shell sessions or (``image_python=True``) the Python executor.
"""

from __future__ import annotations

import base64
import io
import os
import sys
import tarfile
from collections.abc import Iterator
from contextlib import redirect_stderr
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "images"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _build import (  # noqa: E402
    BUSYBOX,
    Entry,
    Layer,
    bash_layer,
    busybox_layer,
    oci_layout,
    oci_layout_from_rootfs,
)
from _server import call, judge_server  # noqa: E402

from toolservices.errors import UserError  # noqa: E402
from toolservices.judge import CodeJudge  # noqa: E402
from toolservices.judge._languages import discover  # noqa: E402

ROOTFS = os.environ.get("TOOLSERVICES_TEST_ROOTFS") or os.path.expanduser(
    "~/.cache/toolservices-tests/debian-bookworm-python.tar"
)


def _need_busybox() -> None:
    if not os.path.exists(BUSYBOX):
        pytest.skip(f"{BUSYBOX} is missing (Debian package busybox-static)")


def _need_session_namespaces(judge: CodeJudge) -> None:
    layer = judge.isolation_report()["layers"]["session_namespaces"]
    if not layer["active"]:
        pytest.skip(f"no session namespaces here (an image root needs them): {layer}")


@pytest.fixture(scope="module")
def busybox_ref(tmp_path_factory: pytest.TempPathFactory) -> str:
    _need_busybox()
    root = tmp_path_factory.mktemp("judge-busybox")
    oci_layout(str(root / "oci"), [busybox_layer("gzip"), bash_layer("zstd")])
    return f"oci:{root}/oci"


@pytest.fixture(scope="module")
def busybox(busybox_ref: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[CodeJudge]:
    cache = tmp_path_factory.mktemp("judge-busybox-cache")
    with CodeJudge(concurrency=2, spares=1, image=busybox_ref, image_cache=str(cache)) as judge:
        _need_session_namespaces(judge)
        yield judge


@pytest.fixture(scope="module")
def debian_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if not os.path.exists(ROOTFS):
        pytest.skip(
            f"no Debian rootfs at {ROOTFS}: .ci/run makes it with mmdebstrap "
            "(or set TOOLSERVICES_TEST_ROOTFS to a rootfs tar with python3 and pytest)"
        )
    root = tmp_path_factory.mktemp("judge-debian")
    oci_layout_from_rootfs(str(root / "oci"), ROOTFS, [])
    return root


@pytest.fixture(scope="module", params=["shell", "image-python"])
def debian(debian_root: Path, request: pytest.FixtureRequest) -> Iterator[CodeJudge]:
    """Python through shell sessions (the default), or the image's own interpreter in the
    Python executor (``image_python=True``): the same answers."""
    with CodeJudge(
        concurrency=2,
        spares=1,
        image=f"oci:{debian_root}/oci",
        image_cache=str(debian_root / "cache"),
        image_python=request.param == "image-python",
    ) as judge:
        _need_session_namespaces(judge)
        assert (judge._python is not None) == (request.param == "image-python")
        yield judge


def test_a_submission_runs_on_the_images_root(busybox: CodeJudge) -> None:
    r = busybox.run_code(
        "cat /etc/os-release /repo/task.txt; id -u; read x; echo sh$x", "bash", stdin="x\n"
    )
    assert r["status"] == "Success", r
    assert r["run_result"]["stdout"] == "ID=testbox\nfix me\n0\nshx\n"
    report = busybox.isolation_report()
    assert report["image"]["reference"].startswith("oci:")
    assert report["toolchains_bound"] == []


def test_each_submission_gets_a_fresh_root(busybox: CodeJudge) -> None:
    first = busybox.run_code("echo mine > /repo/task.txt; rm /bin/cat; echo done", "bash")
    assert first["run_result"]["stdout"] == "done\n", first
    second = busybox.run_code("cat /repo/task.txt", "bash")
    assert second["run_result"]["stdout"] == "fix me\n", second


def test_a_toolchain_the_image_lacks_is_a_sandbox_error(busybox: CodeJudge) -> None:
    available = busybox.available()
    assert [k for k, v in available.items() if v == "ok"] == ["bash"]
    r = busybox.run_code("print(1)", "python")
    assert r["status"] == "SandboxError" and r["run_result"] is None
    assert "'python3' (or 'python') in image 'oci:" in r["message"], r
    cpp = busybox.run_tests("int main(){}", "cpp", [{"stdin": ""}])
    assert cpp["status"] == "SandboxError" and "'g++' on the PATH of image" in cpp["message"]
    assert busybox.score("print(1)", "python", [{"expected_stdout": "1"}]) == 0.0


def test_limits_hold_on_an_image(busybox: CodeJudge) -> None:
    slow = busybox.run_code("echo before; sleep 5", "bash", run_timeout=0.5)
    assert slow["run_result"]["status"] == "TimeLimitExceeded"
    assert slow["run_result"]["stdout"] == "before\n"
    limits = busybox.run_code("ulimit -v; ulimit -s", "bash", memory_limit_MB=256)
    assert limits["run_result"]["stdout"] == "262144\n262144\n", limits


def test_an_image_without_bash_is_a_user_error(
    tmp_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    _need_busybox()
    oci_layout(str(tmp_path / "oci"), [busybox_layer("gzip")])
    with pytest.raises(UserError, match="has no /bin/bash"):
        CodeJudge(concurrency=1, image=f"oci:{tmp_path}/oci", image_cache=str(tmp_path / "c"))


def test_serve_with_image(busybox_ref: str, tmp_path: Path) -> None:
    pytest.importorskip("uvicorn")
    with judge_server(
        "--concurrency", "1", "--image", busybox_ref, "--image-cache", str(tmp_path)
    ) as url:
        status, body = call(url, "/run_code", {"code": "cat /etc/os-release", "language": "bash"})
        assert status == 200 and body["run_result"]["stdout"] == "ID=testbox\n", body
        status, body = call(url, "/run_code", {"code": "print(1)", "language": "python"})
        assert status == 200 and body["status"] == "SandboxError", body
        assert "in image" in body["message"]


def test_serve_with_a_missing_image_says_so(tmp_path: Path) -> None:
    pytest.importorskip("uvicorn")
    from toolservices.cli import main

    err = io.StringIO()
    with redirect_stderr(err):
        code = main(
            ["serve", "--sandbox-fusion", "--port", "0", "--image", f"oci:{tmp_path}/none"]
            + ["--image-cache", str(tmp_path / "cache")]
        )
    assert code == 2
    assert err.getvalue().startswith("toolservices serve: ") and "none" in err.getvalue()


@pytest.mark.timeout(120)  # the first test unpacks a 300 MB distribution into the cache
def test_python_runs_on_the_images_interpreter(debian: CodeJudge) -> None:
    r = debian.run_code(
        "import sys\nprint(sys.executable, open('/etc/debian_version').read().split('.')[0], "
        "input())\nprint(__name__, sys.argv)",
        "python",
        stdin="hi\n",
    )
    assert r["status"] == "Success", r
    assert r["run_result"]["stdout"] == "/usr/bin/python3 12 hi\n__main__ ['main.py']\n"
    assert debian.toolchains["python"].tools["python"] == "/usr/bin/python3"
    # the compile cache's key names the image, not the host's tool of the same name
    assert debian.toolchains["perl"].identity != discover("perl").identity


def test_pytest_from_the_image(debian: CodeJudge) -> None:
    r = debian.run_code("def test_ok():\n    assert 1 + 1 == 2\n", "pytest")
    assert r["status"] == "Success" and "1 passed" in r["run_result"]["stdout"], r


def test_python_limits_files_and_failures_on_the_image(debian: CodeJudge) -> None:
    big = debian.run_code("x = bytearray(600 << 20)", "python", memory_limit_MB=256)
    assert big["status"] == "Failed" and "MemoryError" in big["run_result"]["stderr"], big
    slow = debian.run_code("print('a', flush=True)\nwhile 1: pass", "python", run_timeout=0.5)
    assert slow["run_result"]["status"] == "TimeLimitExceeded"
    assert slow["run_result"]["stdout"] == "a\n"
    files = debian.run_code(
        "open('out.txt', 'w').write(open('in.txt').read() * 2)",
        "python",
        files={"in.txt": base64.b64encode(b"ab").decode()},
        fetch_files=["out.txt"],
    )
    assert base64.b64decode(files["files"]["out.txt"]) == b"abab", files
    reference = debian.isolation_report()["image"]["reference"]
    assert debian.run_code("int main(){}", "cpp")["message"].endswith(
        f"missing 'g++' on the PATH of image {reference!r}"
    )


def test_run_tests_and_jupyter_on_the_image(debian: CodeJudge) -> None:
    cases = [{"stdin": "3", "expected_stdout": "9"}, {"stdin": "4", "expected_stdout": "17"}]
    r = debian.run_tests("print(int(input()) ** 2)", "python", cases)
    assert [c["verdict"] for c in r["cases"]] == ["accepted", "wrong_answer"], r
    cells = debian.run_jupyter(["import sys; v = sys.version_info[:2]", "v"])
    assert cells["status"] == "Success", cells
    assert cells["cells"][1]["display"] == [{"text/plain": "(3, 11)"}]


def test_image_python_falls_back_to_shell_sessions(tmp_path: Path) -> None:
    """A python3 the executor cannot serve (here a script, as Python 2 would be): Python
    programs run in shell sessions with it, as without ``image_python``."""
    _need_busybox()
    d = tarfile.DIRTYPE
    fake = Layer(
        [
            Entry("usr/", kind=d, mode=0o755),
            Entry("usr/bin/", kind=d, mode=0o755),
            Entry("usr/bin/python3", b"#!/bin/sh\necho old python; cat main.py\n", mode=0o755),
        ]
    )
    oci_layout(
        str(tmp_path / "oci"),
        [busybox_layer("gzip"), bash_layer("zstd"), fake],
        env=("PATH=/usr/bin:/bin",),
    )
    with CodeJudge(
        concurrency=1,
        spares=0,
        image=f"oci:{tmp_path}/oci",
        image_cache=str(tmp_path / "cache"),
        image_python=True,
    ) as judge:
        _need_session_namespaces(judge)
        assert judge._python is None
        r = judge.run_code("print(1)", "python")
        assert r["run_result"]["stdout"] == "old python\nprint(1)", r
