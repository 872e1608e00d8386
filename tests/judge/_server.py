"""Start ``toolservices serve --sandbox-fusion`` as a real process on a free loopback port."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

SRC = str(Path(__file__).resolve().parents[2] / "src")
READY = "toolservices judge ready: "


@contextlib.contextmanager
def judge_server(*args: str, python: str = sys.executable) -> Iterator[str]:
    """The server's base URL while it runs; stopped (SIGTERM, then SIGKILL) afterwards."""
    env = {**os.environ, "PYTHONPATH": SRC + os.pathsep + os.environ.get("PYTHONPATH", "")}
    proc = subprocess.Popen(
        [python, "-m", "toolservices", "serve", "--sandbox-fusion", "--port", "0", *args],
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        start_new_session=True,
    )
    try:
        assert proc.stderr is not None
        lines = []
        for line in proc.stderr:  # blocks until the ready line, or EOF if it died
            lines.append(line)
            if line.startswith(READY):
                break
        else:
            raise RuntimeError("the judge server did not start:\n" + "".join(lines))
        yield line[len(READY) :].strip()
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        if proc.stderr is not None:
            proc.stderr.close()
