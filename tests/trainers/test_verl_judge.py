"""verl 0.9's own SandboxFusion reward client, unchanged, against ``serve --sandbox-fusion``.

Needs verl (its own venv, .ci/run): ``check_correctness`` for Python, C++, an
``fn_name`` case and a timeout, and ``compute_score`` on a markdown completion.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("verl")
pytest.importorskip("uvicorn")
from verl.utils.reward_score import sandbox_fusion  # noqa: E402
from verl.utils.reward_score.sandbox_fusion.utils import check_correctness  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "judge"))
from _server import judge_server  # noqa: E402

sys.path.pop(0)

# Run in verl's own venv (.ci/run), like test_verl.py: the module's server start and
# verl's thread pools were not measured against the suite's 60 s.
pytestmark = pytest.mark.timeout(180)


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    with judge_server("--concurrency", "4") as base:
        yield base + "/run_code"


def test_python_stdin_cases(url: str) -> None:
    code = "a, b = map(int, input().split())\nprint(a + b)\n"
    results, meta = check_correctness(
        url, {"inputs": ["1 2\n", "5 7\n", "0 0\n"], "outputs": ["3\n", "12\n", "1\n"]}, code
    )
    assert results == [True, True, False]
    assert meta[2]["stdout"] == "0\n"


def test_cpp_compiled_and_a_compile_error(url: str) -> None:
    code = "#include <iostream>\nint main(){long a,b;std::cin>>a>>b;std::cout<<a*b<<std::endl;}\n"
    results, _ = check_correctness(
        url, {"inputs": ["6 7\n", "2 3\n"], "outputs": ["42\n", "6\n"]}, code, language="cpp"
    )
    assert results == [True, True]
    results, meta = check_correctness(
        url, {"inputs": ["1\n"], "outputs": ["1\n"]}, "int main( {", language="cpp"
    )
    assert results == [-4] and meta[0]["status"] == "compile_error"


def test_fn_name_cases(url: str) -> None:
    code = "class Solution:\n    def twoSum(self, nums, target):\n" + (
        "        seen = {}\n        for i, x in enumerate(nums):\n"
        "            if target - x in seen:\n                return [seen[target - x], i]\n"
        "            seen[x] = i\n"
    )
    cases = {
        "fn_name": "twoSum",
        "inputs": ["[2, 7, 11, 15]\n9", "[3, 2, 4]\n6"],
        "outputs": ["[0, 1]", "[1, 2]"],
    }
    results, _ = check_correctness(url, cases, code)
    assert results == [True, True]


def test_a_timeout(url: str) -> None:
    results, meta = check_correctness(
        url, {"inputs": [""], "outputs": ["x"]}, "while True:\n    pass\n", timeout=1
    )
    assert results == [-3] and meta[0]["status"] == "timeout"


def test_compute_score(url: str) -> None:
    completion = "Here it is:\n```python\nn = int(input())\nprint(n * n)\n```\n"
    tests = {"inputs": ["3\n", "4\n", "5\n", "6\n"], "outputs": ["9\n", "16\n", "25\n", "35\n"]}
    score, meta = sandbox_fusion.compute_score(url, threading.Semaphore(4), 1024, completion, tests)
    assert score == pytest.approx(0.75)
    assert len(meta) == 4
