"""Base directories left by a killed caller are swept by the next executor."""

from __future__ import annotations

import os
import subprocess
import sys

from toolservices.python import PythonExecutorService, SandboxConfig


def test_stale_base_of_a_dead_owner_is_removed(tmp_path: os.PathLike[str]) -> None:
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        capture_output=True,
        text=True,
        check=True,
    )
    dead_pid = int(dead.stdout)
    stale = os.path.join(tmp_path, f"toolservices-sbx-{dead_pid}-abc123")
    os.makedirs(os.path.join(stale, "w0", "deep"))
    alive = os.path.join(tmp_path, f"toolservices-sbx-{os.getpid()}-keepme")
    os.makedirs(alive)
    unrelated = os.path.join(tmp_path, "toolservices-sbx-notapid")
    os.makedirs(unrelated)
    config = SandboxConfig(base_dir=str(tmp_path))
    with PythonExecutorService(pool_size=1, sandbox=config) as executor:
        assert executor.execute("print(1)")["stdout"] == "1\n"
        assert not os.path.exists(stale)
        assert os.path.isdir(alive) and os.path.isdir(unrelated)
