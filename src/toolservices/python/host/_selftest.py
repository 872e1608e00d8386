"""The sandbox's live self-test, run through a real executor (``sandbox-check --self-test``).

The checks and their verdicts live in the sandbox (``sandbox/_selftest.py``);
this side runs them, each in a fresh interpreter of a
:class:`PythonExecutorService` with the test's settings.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from toolservices.python import sandbox
from toolservices.python.host._service import PythonExecutorService
from toolservices.python.sandbox import SandboxConfig

__all__ = ["self_test"]


def _run_checks(
    config: SandboxConfig, codes: Mapping[str, str], timeout: float
) -> tuple[dict[str, Any], dict[str, str]]:
    """Each snippet in a fresh interpreter of a real executor: (its report, outputs by name)."""
    outputs: dict[str, str] = {}
    with PythonExecutorService(pool_size=1, sandbox=config, spares=0) as service:
        for name, code in codes.items():
            result = service.execute(code, timeout=timeout)
            outputs[name] = result.stdout + result.stderr
        report = service.isolation_report()
    return report, outputs


def self_test(config: SandboxConfig | None = None) -> dict[str, Any]:
    """Run the sandbox's bounded hostile checks through the executor; see ``format_self_test``."""
    return sandbox.self_test(config, run_checks=_run_checks)
