"""The hostile checks of test_isolation.py, through the real PythonExecutorService.

Each test names the layer it relies on and skips with the report's reason when
that layer is inactive at the level under test. Every snippet is bounded.
"""

from __future__ import annotations

import os
import secrets
import socket
import tempfile
from collections.abc import Iterator
from typing import Any

import pytest
from tests.python.conftest import wait_until_gone

from toolservices.python import PythonExecutorService
from toolservices.python.sandbox import SandboxConfig

pytestmark = pytest.mark.timeout(240)

MARK = f"SBXMARK_{secrets.token_hex(4)}"
SECRET = secrets.token_hex(16)
LIMITS: dict[str, Any] = {"memory_limit": 1 << 30, "file_size": 16 << 20, "nproc": 48}
VARIANTS = {
    "L3": {},
    "L2": {"bwrap": False},
    "L1": {"bwrap": False, "seccomp": False, "landlock": False},
}


@pytest.fixture(scope="module")
def listener() -> Iterator[socket.socket]:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(8)
    sock.setblocking(False)
    yield sock
    sock.close()


@pytest.fixture(scope="module", params=list(VARIANTS))
def service(request: pytest.FixtureRequest) -> Iterator[tuple[str, Any]]:
    old = os.environ.get("SANDBOX_TEST_SECRET")
    os.environ["SANDBOX_TEST_SECRET"] = SECRET
    svc = PythonExecutorService(
        pool_size=2, timeout=15.0, sandbox=SandboxConfig(**LIMITS, **VARIANTS[request.param])
    )
    try:
        yield request.param, svc
    finally:
        svc.close()
        if old is None:
            os.environ.pop("SANDBOX_TEST_SECRET", None)
        else:
            os.environ["SANDBOX_TEST_SECRET"] = old


def _need(svc: Any, variant: str, *layers: str) -> None:
    report = svc.isolation_report()
    for name in layers:
        layer = report["layers"][name]
        if not layer["active"]:
            pytest.skip(f"{variant}: layer {name} inactive: {layer.get('why')}")


def _run(svc: Any, code: str) -> str:
    result = svc.execute(code)
    return str(result["stdout"]) + str(result["stderr"])


def test_controls(service: tuple[str, Any]) -> None:
    _, svc = service
    out = _run(svc, "import threading; open('f.txt','w').write('ok'); print(open('f.txt').read())")
    assert "ok" in out


def test_env_secret_invisible(service: tuple[str, Any]) -> None:
    """Layer env_allowlist."""
    variant, svc = service
    _need(svc, variant, "env_allowlist")
    out = _run(svc, "import os; print(os.environ.get('SANDBOX_TEST_SECRET'))")
    assert SECRET not in out and "None" in out


def test_identity(service: tuple[str, Any]) -> None:
    """Layers no_new_privs and uid_drop (as root)."""
    variant, svc = service
    _need(svc, variant, "no_new_privs")
    out = _run(
        svc,
        "import os; s = open('/proc/self/status').read()\n"
        "print('UID', os.getuid(), 'NNP', s.split('NoNewPrivs:')[1].split()[0])",
    )
    assert "NNP 1" in out
    if os.geteuid() == 0:
        _need(svc, variant, "uid_drop")
        assert "UID 0 " not in out


def test_write_outside_workdir_fails(service: tuple[str, Any]) -> None:
    """Layer readonly_fs: even a 0777 host directory (that DAC would allow) is closed."""
    variant, svc = service
    _need(svc, variant, "readonly_fs")
    target = tempfile.mkdtemp(prefix="sbx_canary_", dir="/tmp")
    try:
        os.chmod(target, 0o777)
        out = _run(svc, f"open({os.path.join(target, MARK)!r}, 'w').write('x')")
        assert not os.listdir(target), out
    finally:
        for name in os.listdir(target):
            os.unlink(os.path.join(target, name))
        os.rmdir(target)


def test_loopback_blocked(service: tuple[str, Any], listener: socket.socket) -> None:
    """Layer network."""
    variant, svc = service
    _need(svc, variant, "network")
    port = listener.getsockname()[1]
    out = _run(
        svc,
        f"import socket\ntry:\n    socket.create_connection(('127.0.0.1', {port}), 2)"
        "\n    print('CONNECTED')\nexcept OSError as e:\n    print('BLOCKED', e)",
    )
    assert "CONNECTED" not in out
    with pytest.raises(BlockingIOError):
        listener.accept()


def test_memory_bomb(service: tuple[str, Any]) -> None:
    """Layer rlimits (AS = 1 GiB)."""
    variant, svc = service
    _need(svc, variant, "rlimits")
    result = svc.execute("x = bytearray(2 << 30)")
    assert not result["success"]
    assert "MemoryError" in result["stderr"]


def test_fork_bomb_bounded(service: tuple[str, Any]) -> None:
    """Layer nproc_limit."""
    variant, svc = service
    _need(svc, variant, "nproc_limit")
    out = _run(
        svc,
        "import os, time\nkids = []\nfor _ in range(200):\n    try:\n"
        "        pid = os.fork()\n    except OSError:\n        break\n"
        "    if pid == 0:\n        time.sleep(3)\n        os._exit(0)\n"
        "    kids.append(pid)\nprint('FORKED', len(kids))\n"
        "for pid in kids:\n    os.kill(pid, 9)\n    os.waitpid(pid, 0)\n",
    )
    assert "FORKED" in out
    assert int(out.split("FORKED")[1].split()[0]) < 200


def test_disk_fill_bounded(service: tuple[str, Any]) -> None:
    """Layer rlimits (FSIZE = 16 MiB)."""
    variant, svc = service
    _need(svc, variant, "rlimits")
    result = svc.execute(
        "with open('fill.bin', 'wb') as f:\n"
        "    for _ in range(256):\n        f.write(b'x' * (1 << 20)); f.flush()"
    )
    assert not result["success"]
    assert "File too large" in result["stderr"] or "EFBIG" in result["stderr"]


def test_double_forked_orphans_do_not_survive(service: tuple[str, Any]) -> None:
    """Layer orphan_cleanup (PID namespace at L3, subreaper and uid sweep otherwise)."""
    _, svc = service
    code = (
        "import os, subprocess, sys\nif os.fork() == 0:\n"
        f"    subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(20)', {MARK!r}],"
        " start_new_session=True)\n    os._exit(0)\nos.wait()\nprint('SPAWNED')"
    )
    session = "orphan-test"
    assert "SPAWNED" in _run_session(svc, code, session)
    svc.close_session(session)
    # namespace and subreaper teardown are asynchronous
    left = [p.pid for p in wait_until_gone(MARK, within=5.0)]
    for pid in left:  # keep the machine clean even if the assertion fails
        os.kill(pid, 9)
    assert left == []


def _run_session(svc: Any, code: str, session: str) -> str:
    result = svc.execute(code, session_id=session)
    return str(result["stdout"]) + str(result["stderr"])
