"""Shell sessions as a shared service, on both backends: a session stays on its replica."""

from __future__ import annotations

import pickle
import sys
import tarfile
import threading
from pathlib import Path
from typing import Any

import pytest

from toolservices.services import ServiceRegistry, get_services
from toolservices.shell import ShellFileError, ShellService

pytestmark = pytest.mark.timeout(180)


def _options(backend: str) -> dict[str, Any]:
    return {"num_cpus": 0} if backend == "ray" else {}


def _in_other_worker(backend: str, namespace: str, command: str, session_id: str) -> dict[str, Any]:
    """Run ``command`` through a registry object of another worker (a Ray task, or a thread)."""
    if backend == "ray":
        import ray

        @ray.remote(num_cpus=0)
        def task() -> dict[str, Any]:
            client = get_services("ray", namespace=namespace).client("shell")
            return dict(client.call("run", command, session_id=session_id))

        return ray.get(task.remote(), timeout=60)
    out: dict[str, Any] = {}

    def run() -> None:
        client = get_services("local", namespace=namespace).client("shell")
        out.update(client.call("run", command, session_id=session_id))

    thread = threading.Thread(target=run)
    thread.start()
    thread.join(timeout=60)
    return out


def test_shell_session_affinity_across_workers(backend: str, registry: ServiceRegistry) -> None:
    registry.register(
        "shell", ShellService, pool_size=2, timeout=10.0, num_replicas=2, **_options(backend)
    )
    client = registry.client("shell")
    for sid in ("env-0", "env-1", "env-2", "env-3"):
        assert client.call("run", f"mkdir -p d && cd d && export WHO={sid}", session_id=sid)[
            "success"
        ]
    for sid in ("env-0", "env-1", "env-2", "env-3"):
        out = _in_other_worker(backend, registry.namespace, 'echo "$WHO $(basename $PWD)"', sid)
        assert out["stdout"] == f"{sid} d\n", out
    client.call("write_file", "f.txt", "hello", session_id="env-0")
    assert client.call("read_file", "f.txt", session_id="env-0") == "hello"
    with pytest.raises(ShellFileError) as info:
        client.call("read_file", "missing", session_id="env-0")
    assert info.value.reason == "ENOENT"
    assert client.call("close_session", session_id="env-0") is True


def test_shell_file_error_pickles() -> None:
    err = pickle.loads(pickle.dumps(ShellFileError("read_file", "x", "ENOENT", "No such file")))
    assert (err.op, err.path, err.reason, str(err)) == (
        "read_file",
        "x",
        "ENOENT",
        "read_file: x: No such file",
    )


def test_sessions_on_another_image_through_the_registry(
    backend: str, registry: ServiceRegistry, tmp_path: Path
) -> None:
    """``start_session(session_id=..., image=...)`` routes by the session id like every
    call: the replica that serves the session pulls the image by its reference."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "images"))
    try:
        from _build import BUSYBOX, Entry, Layer, bash_layer, busybox_layer, oci_layout
    finally:
        sys.path.pop(0)
    if not Path(BUSYBOX).exists():
        pytest.skip(f"{BUSYBOX} is missing (Debian package busybox-static)")
    task = Layer([Entry("task/", kind=tarfile.DIRTYPE, mode=0o755), Entry("task/id", b"B\n")])
    oci_layout(str(tmp_path / "oci"), [busybox_layer("gzip"), bash_layer("gzip"), task])
    registry.register(
        "shell",
        ShellService,
        pool_size=1,
        timeout=20.0,
        num_replicas=2,
        image_cache=str(tmp_path / "cache"),
        **_options(backend),
    )
    client = registry.client("shell")
    report = client.call("isolation_report")
    if not report["layers"]["session_namespaces"]["active"]:
        pytest.skip("no session namespaces here (an image root needs them)")
    for sid in ("img-0", "img-1", "img-2", "img-3"):
        assert client.call("start_session", session_id=sid, image=f"oci:{tmp_path}/oci") == sid
    for sid in ("img-0", "img-1", "img-2", "img-3"):
        out = client.call("run", "cat /task/id; id -u", session_id=sid)
        assert out["stdout"] == "B\n0\n", out
    assert client.call("run", "test -e /task || echo host", session_id="plain")["stdout"] == (
        "host\n"
    )
