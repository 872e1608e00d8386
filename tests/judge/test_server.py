"""The judge's HTTP server on 127.0.0.1 (uvicorn in a thread of this process, and the
``serve --sandbox-fusion`` command as a process): routes, SandboxFusion's defaults,
FastAPI-shaped 422s, /run_tests, /metrics, 504 on overload; the admission queue's turns."""

from __future__ import annotations

import asyncio
import socket
import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("uvicorn")
pytest.importorskip("starlette")

sys.path.insert(0, str(Path(__file__).parent))
from _server import app_server, call, judge_server  # noqa: E402

sys.path.pop(0)


from toolservices.errors import ExecutorBusyError  # noqa: E402
from toolservices.judge import CodeJudge  # noqa: E402
from toolservices.judge._admission import Admission  # noqa: E402


@pytest.fixture(scope="module")
def base() -> Iterator[str]:
    with CodeJudge(concurrency=2, spares=1) as judge, app_server(judge) as url:
        yield url


def test_ping(base: str) -> None:
    assert call(base, "/v1/ping") == (200, "pong")


def test_the_command_serves() -> None:
    with judge_server("--concurrency", "1") as url:
        assert call(url, "/v1/ping") == (200, "pong")
        status, body = call(url, "/run_code", {"code": "print(2)", "language": "python"})
        assert status == 200 and body["run_result"]["stdout"] == "2\n"


def test_run_code_with_only_code_and_language(base: str) -> None:
    status, body = call(base, "/run_code", {"code": "print(6*7)", "language": "python"})
    assert status == 200
    assert set(body) == {
        "status",
        "message",
        "compile_result",
        "run_result",
        "executor_pod_name",
        "files",
    }
    assert body["status"] == "Success" and body["run_result"]["stdout"] == "42\n"
    assert set(body["run_result"]) == {
        "status",
        "execution_time",
        "return_code",
        "stdout",
        "stderr",
    }


def test_422_missing_field(base: str) -> None:
    status, body = call(base, "/run_code", {"language": "python"})
    assert status == 422
    assert body["detail"][0]["type"] == "missing" and body["detail"][0]["loc"] == ["body", "code"]
    assert body["detail"][0]["msg"] == "Field required"


def test_422_unknown_language(base: str) -> None:
    status, body = call(base, "/run_code", {"code": "x", "language": "cobol"})
    assert status == 422 and body["detail"][0]["type"] == "literal_error"
    assert body["detail"][0]["loc"] == ["body", "language"]


def test_422_bad_json(base: str) -> None:
    status, body = call(base, "/run_code", raw=b'{"code": ')
    assert status == 422 and body["detail"][0]["type"] == "json_invalid"


def test_missing_toolchain_answers_sandbox_error(base: str) -> None:
    status, body = call(base, "/run_code", {"code": "x", "language": "python_gpu"})
    assert status == 200 and body["status"] == "SandboxError" and "GPU" in body["message"]


def test_run_jupyter(base: str) -> None:
    status, body = call(base, "/run_jupyter", {"cells": ["x = 2", "x * 21"]})
    assert status == 200 and body["cells"][1]["display"] == [{"text/plain": "42"}]
    assert body["driver"]["status"] == "Finished"


def test_run_tests(base: str) -> None:
    req = {
        "code": "print(int(input()) ** 2)",
        "language": "python",
        "cases": [{"stdin": "3", "expected_stdout": "9"}, {"stdin": "4", "expected_stdout": "15"}],
    }
    status, body = call(base, "/run_tests", req)
    assert status == 200
    assert [c["verdict"] for c in body["cases"]] == ["accepted", "wrong_answer"]


def test_metrics(base: str) -> None:
    call(base, "/run_code", {"code": "print(1)", "language": "python"})
    status, text = call(base, "/metrics")
    assert status == 200
    assert 'toolservices_judge_requests_total{path="/run_code",code="200"}' in text
    assert "toolservices_judge_running 0" in text


def test_overload_answers_504() -> None:
    with CodeJudge(concurrency=1, spares=1) as judge, app_server(judge, max_queue=0) as url:
        req = {"code": "import time; time.sleep(3)", "language": "python"}
        with ThreadPoolExecutor(4) as pool:
            codes = [s for s, _ in pool.map(lambda _: call(url, "/run_code", req), range(4))]
    assert sorted(set(codes)) == [200, 504] and codes.count(504) >= 1


async def test_admission_turns_per_client() -> None:
    adm = Admission(concurrency=1, max_queue=10, max_wait=30)
    assert await adm.enter("a")
    order: list[str] = []

    async def req(client: str) -> None:
        assert await adm.enter(client)
        order.append(client)
        adm.leave()

    tasks = [asyncio.ensure_future(req(c)) for c in ["a", "a", "a", "b", "b"]]
    await asyncio.sleep(0)  # let every request queue up
    adm.leave()
    await asyncio.gather(*tasks)
    assert order == ["a", "b", "a", "b", "a"]


async def test_admission_full_queue_and_wait_bound() -> None:
    adm = Admission(concurrency=1, max_queue=1, max_wait=30)
    assert await adm.enter("a")
    waiter = asyncio.ensure_future(adm.enter("b", 0.05))
    await asyncio.sleep(0)
    assert not await adm.enter("c")  # queue full: 504 at once
    assert not await waiter  # no slot within its wait: 504
    assert adm.waiting == 0 and adm.rejected == 2
    adm.leave()
    assert adm.running == 0


def test_a_value_the_judge_refuses_is_a_sandbox_error(base: str) -> None:
    status, body = call(base, "/run_code", {"code": "echo", "language": "bash", "run_timeout": -1})
    assert status == 200 and body["status"] == "SandboxError"
    assert "timeout" in body["message"] and body["run_result"] is None


def test_the_command_line_takes_one_protocol(capsys: pytest.CaptureFixture[str]) -> None:
    from toolservices.cli import main

    with pytest.raises(SystemExit) as exc:
        main(["serve", "--mcp", "--sandbox-fusion"])
    assert exc.value.code == 2
    assert "not allowed with argument" in capsys.readouterr().err


def test_a_taken_port_is_said(capsys: pytest.CaptureFixture[str]) -> None:
    from toolservices.judge import serve_judge

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert serve_judge(port=port, concurrency=1) == 2
    assert f"cannot listen on 127.0.0.1:{port}" in capsys.readouterr().err


class _FaultyJudge:
    """Faults a real judge cannot be made to show: a hang past the budget, an overload
    raised from inside, a bug (fault injection, as the house rules allow)."""

    concurrency = 2

    def __init__(self, fault: str) -> None:
        self.fault = fault

    async def arun_code(self, code: str, language: str, **kwargs: Any) -> dict[str, Any]:
        if self.fault == "hang":
            await asyncio.Event().wait()
        if self.fault == "busy":
            raise ExecutorBusyError("the queue is full")
        raise RuntimeError("a bug")

    arun_jupyter = arun_tests = arun_code

    async def astats(self) -> dict[str, Any]:
        return {}


@pytest.mark.parametrize(
    ("fault", "status", "what"),
    [("hang", 504, "time budget"), ("busy", 504, "overloaded"), ("bug", 200, "RuntimeError")],
)
def test_faults_are_answered(fault: str, status: int, what: str) -> None:
    req = {"code": "x", "language": "python", "run_timeout": 0.1, "compile_timeout": 0.1}
    with app_server(_FaultyJudge(fault), slack=1.5) as url:
        got, body = call(url, "/run_code", req)
        assert got == status
        text = body["detail"] if status == 504 else body["message"]
        assert what in text
        if status == 200:
            assert body["status"] == "SandboxError" and body["run_result"] is None
        assert "toolservices_judge_running 0" in call(url, "/metrics")[1]
