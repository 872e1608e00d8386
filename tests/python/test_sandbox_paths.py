"""Sessions on the host: stale base directories are swept, read-only binds stay visible."""

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


def test_read_only_paths_under_tmp_stay_visible_at_l3(tmp_path: os.PathLike[str]) -> None:
    """A venv or data under /tmp (a CI checkout) is bound over the private /tmp."""
    import pytest

    os.chmod(tmp_path, 0o755)
    data = os.path.join(tmp_path, "data.txt")
    with open(data, "w") as f:
        f.write("visible")
    os.chmod(data, 0o644)
    config = SandboxConfig(extra_ro_paths=(str(tmp_path),))
    with PythonExecutorService(pool_size=1, sandbox=config) as executor:
        if executor.isolation_report()["level"] != "L3":
            pytest.skip("bubblewrap (L3) is not available here")
        result = executor.execute(f"print(open({data!r}).read())")
        assert result.stdout == "visible\n", result.stderr
        denied = executor.execute(f"open({data!r}, 'a').write('x')")
        assert not denied.success  # read-only
