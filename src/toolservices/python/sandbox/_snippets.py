"""Run snippets each in its own sandboxed session, without the executor (host side).

Starts the runtime's snippet runner (``runtime/_snippets.py``) under a real
:func:`plan_server_launch` plan. The isolation tests use it to check each
layer with nothing of the executor's machinery in the way;
``toolservices sandbox-check --self-test`` goes through the executor itself.

``python -m toolservices.python.sandbox._snippets`` is this side in a process
of its own (the tests run it as an unprivileged uid): a JSON job
``{"config", "snippets"}`` on stdin, ``{"report", "results"}`` on stdout.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from typing import Any

from toolservices.python import runtime
from toolservices.python.sandbox._config import SandboxConfig
from toolservices.python.sandbox._planner import plan_server_launch

__all__ = ["SELFTEST_PY", "run_snippets"]

SELFTEST_PY = runtime.script("_snippets")


def run_snippets(
    config: Any,
    snippets: dict[str, dict[str, Any]],
    *,
    python: str = sys.executable,
    timeout: float = 120.0,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Run each snippet in its own sandboxed session; return (report, results by name).

    Each result has ``output`` (stdout and stderr together), ``status`` and
    ``timed_out``. The server is started and shut down here, and the plan
    closed, so no process of the run survives this call.
    """
    plan = plan_server_launch(config, python=python, argv=["-I", "-S", SELFTEST_PY])
    try:
        proc = subprocess.Popen(
            plan.argv,
            env=plan.env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
        try:
            out, err = proc.communicate(
                json.dumps({"snippets": snippets}).encode(), timeout=timeout
            )
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        if proc.returncode != 0:
            raise RuntimeError(
                f"selftest server failed ({proc.returncode}): "
                f"{err.decode(errors='replace')[-2000:]}"
            )
        return plan.report, json.loads(out)
    finally:
        plan.close()


def _drive() -> None:
    job = json.loads(sys.stdin.read())
    report, results = run_snippets(SandboxConfig(**job["config"]), job["snippets"])
    sys.stdout.write(json.dumps({"report": report, "results": results}))


if __name__ == "__main__":
    _drive()
