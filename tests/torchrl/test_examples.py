"""The examples in examples/ run as a user would run them, and finish cleanly."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = sorted((Path(__file__).parents[2] / "examples").glob("*.py"))


# a fresh interpreter per example (the Ray one starts a cluster): its own 300 s bound
@pytest.mark.timeout(300)
@pytest.mark.parametrize("script", EXAMPLES, ids=lambda p: p.name)
def test_example_runs(script: Path) -> None:
    proc = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=300, check=False
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert proc.stdout.strip()


def test_there_are_examples() -> None:
    assert len(EXAMPLES) >= 3
