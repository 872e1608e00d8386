"""The judge's server in front of CodeJudge replicas on a real local Ray (``--ray``)."""

from __future__ import annotations

import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

ray = pytest.importorskip("ray")
pytest.importorskip("uvicorn")

sys.path.insert(0, str(Path(__file__).parent))
from _server import app_server, call  # noqa: E402

sys.path.pop(0)

from toolservices.judge._remote import ray_judge  # noqa: E402
from toolservices.services import get_services  # noqa: E402

pytestmark = pytest.mark.ray

RAY_INIT = {
    "num_cpus": 2,
    "include_dashboard": False,
    "log_to_driver": False,
    "object_store_memory": 80 * 1024 * 1024,
}


@pytest.fixture(scope="module")
def namespace() -> Iterator[str]:
    was_running = ray.is_initialized()
    if not was_running:
        ray.init(**RAY_INIT)
    name = f"judge-{uuid.uuid4().hex[:8]}"
    try:
        yield name
    finally:
        get_services("ray", namespace=name).reset()
        if not was_running:
            ray.shutdown()


def test_requests_reach_a_replica(namespace: str) -> None:
    judge = ray_judge(None, namespace=namespace, concurrency=2, memory_limit_mb=2048)
    assert judge.replicas == 1 and judge.concurrency == 2  # one node here
    with app_server(judge) as base:
        status, body = call(base, "/run_code", {"code": "print(6*7)", "language": "python"})
        assert status == 200 and body["run_result"]["stdout"] == "42\n"
        cpp = '#include <cstdio>\nint main(){puts("c");}'
        status, body = call(base, "/run_code", {"code": cpp, "language": "cpp"})
        assert body["status"] == "Success" and body["run_result"]["stdout"] == "c\n"
        req: dict[str, Any] = {
            "code": "print(input())",
            "language": "python",
            "cases": [{"stdin": "a", "expected_stdout": "a"}],
        }
        assert call(base, "/run_tests", req)[1]["accepted"] == 1
        assert call(base, "/run_jupyter", {"cells": ["1+1"]})[1]["cells"][0]["display"]
        status, text = call(base, "/metrics")
        assert "toolservices_judge_replicas 1" in text
        assert "toolservices_judge_status_Success" in text
    again = ray_judge(None, namespace=namespace, concurrency=2, memory_limit_mb=2048)
    assert again.replicas == 1  # the same replicas, not new ones


def test_replicas_run_on_an_image(namespace: str, tmp_path: Path) -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "images"))
    from _build import BUSYBOX, bash_layer, busybox_layer, oci_layout

    sys.path.pop(0)
    if not Path(BUSYBOX).exists():
        pytest.skip(f"{BUSYBOX} is missing (Debian package busybox-static)")
    oci_layout(str(tmp_path / "oci"), [busybox_layer("gzip"), bash_layer("zstd")])
    images = f"{namespace}-image"
    try:
        # the reference travels to the replica, which pulls it into its node's cache
        judge = ray_judge(
            None,
            namespace=images,
            concurrency=1,
            memory_limit_mb=1024,
            image=f"oci:{tmp_path}/oci",
            image_cache=str(tmp_path / "cache"),
        )
        with app_server(judge) as base:
            req = {"code": "cat /etc/os-release", "language": "bash"}
            status, body = call(base, "/run_code", req)
            assert status == 200 and body["run_result"]["stdout"] == "ID=testbox\n", body
            status, body = call(base, "/run_code", {"code": "print(1)", "language": "python"})
            assert body["status"] == "SandboxError" and "in image" in body["message"], body
    finally:
        get_services("ray", namespace=images).reset()
