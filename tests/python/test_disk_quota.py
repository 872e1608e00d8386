"""SandboxConfig(disk_quota=...): with session namespaces, a session's directory is a tmpfs."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from toolservices.errors import UserError
from toolservices.python import PythonExecutorService, SandboxConfig, isolation_report

QUOTA = 8 << 20
WRITE = "open('blob', 'wb').write(b'\\0' * ({mib} << 20))\nprint('written')"


@pytest.fixture(scope="module")
def executor() -> Iterator[PythonExecutorService]:
    if not isolation_report()["layers"]["session_namespaces"]["active"]:
        pytest.skip("session namespaces are not available here")
    svc = PythonExecutorService(pool_size=1, timeout=20.0, sandbox=SandboxConfig(disk_quota=QUOTA))
    try:
        yield svc
    finally:
        svc.close()


def test_filling_the_quota_is_enospc(executor: PythonExecutorService) -> None:
    res = executor.execute(WRITE.format(mib=16), session_id="q")
    assert not res.success and "No space left on device" in res.stderr
    assert executor.execute(WRITE.format(mib=4), session_id="fresh").stdout == "written\n"


def test_copies_share_the_quota(executor: PythonExecutorService) -> None:
    assert executor.execute(WRITE.format(mib=3), session_id="src").success
    (copy,) = executor.fork_session("src", 1)  # 3 + 3 MiB copied: fits in 8
    res = executor.execute(WRITE.format(mib=3), session_id=copy)  # replaces the copy's blob
    assert res.success, res
    big = executor.execute("open('more', 'wb').write(b'\\0' * (4 << 20))", session_id=copy)
    assert "No space left on device" in big.stderr


def test_disk_quota_must_be_positive() -> None:
    with pytest.raises(UserError, match="disk_quota"):
        SandboxConfig(disk_quota=0)
