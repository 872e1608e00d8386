"""The command line, run as a user would: a real subprocess."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest


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
    # Then the image scenario: the image's pytest fails in /repo, the fix, then it passes.
    image = out[out.index("image scenario") :]
    if "skipped:" not in image:  # (the line says why: no session namespaces here)
        assert "pytest -q -> 1 failed" in image and "-> 1 passed" in image, image
        assert "str_replace /repo/calc.py" in image, image
        assert "add(2, 3) = 5 in /repo" in image, image  # the python tool, same session
        assert "image episode: ok (answered after 5 turns, 4 calls" in image, image


def test_demo_image_scenario_skips_with_a_clear_line(monkeypatch: pytest.MonkeyPatch) -> None:
    """Where image sessions cannot run (no user namespaces: not makeable here for real, so
    the service's refusal is injected), the scenario says so in one line and passes."""
    import io

    import anyio

    from toolservices import shell
    from toolservices.cli._demo_task import run_image_demo
    from toolservices.errors import SandboxUnavailableError

    def refuse(**kwargs: object) -> None:
        raise SandboxUnavailableError("user namespaces are disabled (injected)")

    monkeypatch.setattr(shell, "ShellService", refuse)
    out = io.StringIO()
    assert anyio.run(run_image_demo, out) is True
    assert "skipped: image sessions are not available here (user namespaces are disabled" in (
        out.getvalue()
    )


def test_demo_image_scenario_skips_without_ldd() -> None:
    """No ldd on PATH (a real machine without it): the image cannot be built; one line."""
    proc = subprocess.run(
        [
            sys.executable,
            "-c",
            "import anyio, sys; from toolservices.cli._demo_task import "
            "run_image_demo; sys.exit(0 if anyio.run(run_image_demo, sys.stdout) else 1)",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={**os.environ, "PATH": "/nonexistent"},
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "skipped: cannot build the demo's image here" in proc.stdout, proc.stdout


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
