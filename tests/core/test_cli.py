"""The command line, run as a user would: a real subprocess."""

from __future__ import annotations

import re
import subprocess
import sys


def run_cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "toolservices", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def test_demo_runs_32_episodes_and_succeeds() -> None:
    proc = run_cli("demo")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout
    assert "episodes: 32" in out and "formats: 8" in out
    assert "all episodes ended as scripted" in out
    assert out.count("ok (answered)") == 32
    assert "wall time" in out
    # The recovering episode of each format had exactly one malformed or failing first call.
    summary = next(line for line in out.splitlines() if line.startswith("episodes: "))
    counts = dict(re.findall(r"(calls|failed calls|parse errors): (\d+)", summary))
    assert int(counts["failed calls"]) + int(counts["parse errors"]) == 8, summary
    # Then the shell scenario: the test fails, str_replace fixes the program, the test passes.
    assert "AssertionError: -1 [exit status 1]" in out
    assert "str_replace calc.py" in out and "-> tests passed" in out
    assert "shell episode: ok (answered after 5 turns, 5 calls" in out


def test_help_and_bad_arguments() -> None:
    assert "demo" in run_cli("--help").stdout
    bad = run_cli("demo", "--repeats", "0")
    assert bad.returncode == 2 and "--repeats" in bad.stderr


def test_sandbox_check_reports_layers_and_self_test_holds() -> None:
    proc = run_cli("sandbox-check", "--self-test", timeout=180)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "isolation level: L" in proc.stdout
    assert "env_allowlist" in proc.stdout
    assert "FAILED" not in proc.stdout


def test_serve_help_says_what_timeout_and_max_output_limit() -> None:
    text = " ".join(run_cli("serve", "--help").stdout.split())
    assert "seconds per Python call and, with --shell, per shell command" in text
    assert "--max-output" in text and "omitted" in text
