"""SandboxConfig(own_pids=True): each session pid 1 of its own PID namespace, at L3 and L2."""

from __future__ import annotations

import pytest

from toolservices.errors import UserError
from toolservices.python import PythonExecutorService
from toolservices.python.sandbox import SandboxConfig

_SEES = (
    "import os\nprint(os.getpid(), sorted(int(p) for p in os.listdir('/proc') if p.isdigit()))\n"
)


@pytest.mark.parametrize("changes", [{}, {"bwrap": False}], ids=["L3", "L2"])
def test_each_session_sees_only_its_own_processes(changes: dict[str, object]) -> None:
    config = SandboxConfig(own_pids=True, **changes)  # type: ignore[arg-type]
    with PythonExecutorService(pool_size=2, sandbox=config) as py:
        layers = py.isolation_report()["layers"]
        if not layers["session_namespaces"]["active"]:
            pytest.skip(layers["session_namespaces"]["detail"])
        assert "own PID and cgroup namespaces" in layers["session_namespaces"]["detail"]
        for sid in ("a", "b"):
            res = py.execute(_SEES, session_id=sid)
            assert res.stdout == "1 [1]\n", res
        again = py.execute(
            "import subprocess; print(subprocess.run(['true']).returncode)", session_id="a"
        )
        assert again.stdout == "0\n", again
        with pytest.raises(UserError, match="own_pids"):
            py.fork_session("a", 1)
        assert py.execute("print('fine')", session_id="a").stdout == "fine\n"
