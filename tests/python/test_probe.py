"""The sandbox probe: a launch that hangs is killed with everything it started."""

from __future__ import annotations

import sys

import pytest
from tests.python.conftest import wait_until_gone

from toolservices.python.sandbox import _probe as _sandbox_probe


def test_a_hanging_probe_leaves_no_process_behind(
    monkeypatch: pytest.MonkeyPatch, marker: str
) -> None:
    monkeypatch.setattr(_sandbox_probe, "PROBE_TIMEOUT", 1.0)
    # a launcher that starts a helper in its process group and then never answers
    code = (
        "import subprocess, sys, time\n"
        f"subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(30)', '{marker}'])\n"
        "time.sleep(30)"
    )
    result = _sandbox_probe.run_probe([sys.executable, "-c", code, marker], {})
    assert "did not finish within 1 s" in result["error"]
    assert wait_until_gone(marker, within=5.0) == []


def test_a_failing_launcher_reports_its_last_words() -> None:
    code = "import sys\nsys.stderr.write('first\\nbwrap: no permission\\n')\nsys.exit(1)"
    assert _sandbox_probe.run_probe([sys.executable, "-c", code], {}) == {
        "error": "bwrap: no permission"
    }
    assert (
        "printed no report" in _sandbox_probe.run_probe([sys.executable, "-c", "pass"], {})["error"]
    )
