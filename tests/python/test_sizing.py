"""The default ``max_sessions``: sized from free memory and the memory cgroup's room.

The arithmetic runs against fake ``/proc`` and ``/sys`` trees (the function
reads them under a root); one test checks the real machine's figure end to end.
"""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest

from toolservices.python import PythonExecutorService
from toolservices.python.host._sizing import (
    CAP,
    FLOOR,
    SESSION_BYTES,
    default_max_sessions,
    free_memory,
)

GIB = 1 << 30
UNLIMITED_V1 = "9223372036854771712"


def fake_root(
    tmp_path: Path,
    *,
    available: int | None,
    cgroup: str = "0::/\n",
    files: dict[str, str] | None = None,
) -> str:
    proc = tmp_path / "proc"
    (proc / "self").mkdir(parents=True)
    meminfo = "MemTotal:       25000000 kB\n"
    if available is not None:
        meminfo += f"MemAvailable:   {available // 1024} kB\n"
    (proc / "meminfo").write_text(meminfo + "Buffers:          1000 kB\n")
    (proc / "self" / "cgroup").write_text(cgroup)
    for rel, text in (files or {}).items():
        path = tmp_path / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text + "\n")
    return str(tmp_path)


def test_half_the_available_memory_at_three_mib_a_session(tmp_path: Path) -> None:
    root = fake_root(tmp_path, available=12 * GIB)
    assert free_memory(root) == 12 * GIB
    assert default_max_sessions(root=root) == 6 * GIB // SESSION_BYTES == 2048


def test_a_cgroup_v2_limit_tighter_than_the_machine_wins(tmp_path: Path) -> None:
    files = {
        "sys/fs/cgroup/job/memory.max": str(4 * GIB),
        "sys/fs/cgroup/job/memory.current": str(1 * GIB),
        "sys/fs/cgroup/job/worker/memory.max": "max",
        "sys/fs/cgroup/job/worker/memory.current": str(GIB // 2),
    }
    root = fake_root(tmp_path, available=20 * GIB, cgroup="0::/job/worker\n", files=files)
    # the ancestor's room (4 - 1 GiB) is the tightest; "max" below it is no limit
    assert free_memory(root) == 3 * GIB
    assert default_max_sessions(root=root) == 512


def test_a_cgroup_v1_limit_and_its_no_limit_value(tmp_path: Path) -> None:
    cgroup = "4:memory:/pod/c1\n3:cpu,cpuacct:/pod/c1\n0::/\n"
    files = {
        "sys/fs/cgroup/memory/memory.limit_in_bytes": UNLIMITED_V1,
        "sys/fs/cgroup/memory/pod/memory.limit_in_bytes": UNLIMITED_V1,
        "sys/fs/cgroup/memory/pod/c1/memory.limit_in_bytes": str(8 * GIB),
        "sys/fs/cgroup/memory/pod/c1/memory.usage_in_bytes": str(2 * GIB),
    }
    root = fake_root(tmp_path, available=20 * GIB, cgroup=cgroup, files=files)
    assert free_memory(root) == 6 * GIB
    assert default_max_sessions(root=root) == 1024


def test_floor_cap_and_pool_size(tmp_path: Path) -> None:
    small = fake_root(tmp_path / "small", available=GIB // 4)
    assert default_max_sessions(root=small) == FLOOR
    assert default_max_sessions(pool_size=512, root=small) == 512
    huge = fake_root(tmp_path / "huge", available=1024 * GIB)
    assert default_max_sessions(root=huge, nofile=1 << 20) == CAP
    unknown = fake_root(tmp_path / "unknown", available=None)
    assert free_memory(unknown) is None
    assert default_max_sessions(root=unknown) == FLOOR


def test_the_executor_sizes_itself_and_a_copy_sizes_itself_again() -> None:
    svc = PythonExecutorService(pool_size=2)
    expected = default_max_sessions(pool_size=2)
    # the machine's free memory moves between the two reads: allow a few sessions of drift
    assert svc.max_sessions == pytest.approx(expected, abs=16)
    assert FLOOR <= svc.max_sessions <= CAP
    assert svc.stats()["max_sessions"] == svc.max_sessions
    # pickled (a Ray replica): the default travels as "size yourself", not as this number
    assert pickle.loads(pickle.dumps(svc))._config()["max_sessions"] is None
    explicit = PythonExecutorService(pool_size=2, max_sessions=40)
    assert pickle.loads(pickle.dumps(explicit)).max_sessions == 40


def test_every_live_session_can_have_a_call_waiting() -> None:
    """The queue bound grows with max_sessions: a batch calling at once is never refused."""
    assert PythonExecutorService(pool_size=2, max_sessions=40).max_queue == 4096
    large = PythonExecutorService(pool_size=2, max_sessions=10_000)
    assert large.max_queue == 10_000
    assert pickle.loads(pickle.dumps(large))._config()["max_queue"] is None
    assert PythonExecutorService(pool_size=2, max_sessions=10_000, max_queue=8).max_queue == 8


def test_a_shell_session_reserves_more_and_sizes_itself_the_same_way(tmp_path: Path) -> None:
    from toolservices import ShellService
    from toolservices.shell._service import SESSION_BYTES as SHELL_BYTES

    root = fake_root(tmp_path / "m", available=8 * GIB)
    assert default_max_sessions(root=root, session_bytes=SHELL_BYTES) == 512  # 4 GiB / 8 MiB
    shell = ShellService(pool_size=2)
    try:
        expected = default_max_sessions(pool_size=2, session_bytes=SHELL_BYTES)
        assert shell.max_sessions == pytest.approx(expected, abs=16)
        assert shell.stats()["max_sessions"] == shell.max_sessions
        copy = pickle.loads(pickle.dumps(shell))
        try:  # the default travels as "size yourself" to a replica
            assert copy._init_kwargs()["max_sessions"] is None
        finally:
            copy.close()
        explicit = ShellService(pool_size=2, max_sessions=40)
        try:
            assert pickle.loads(pickle.dumps(explicit)).max_sessions == 40
        finally:
            explicit.close()
    finally:
        shell.close()


def test_the_default_never_plans_more_sessions_than_descriptors_allow(tmp_path: Path) -> None:
    plenty = fake_root(tmp_path / "m", available=1024 * GIB)
    assert default_max_sessions(root=plenty, nofile=1 << 20) == CAP
    # 1,024 descriptors, 512 kept for the rest of the process, 5 a session
    assert default_max_sessions(root=plenty, nofile=1024, session_fds=5) == 102
    assert default_max_sessions(pool_size=200, root=plenty, nofile=1024, session_fds=5) == 200


_OUT_OF_FDS = """
import os, resource
from toolservices.errors import InfrastructureError
from toolservices.python import PythonExecutorService
with PythonExecutorService(pool_size=1, max_sessions=500, spares=0) as py:
    assert py.execute("x = 0", session_id="s0").success
    room = len(os.listdir("/proc/self/fd")) + 40
    resource.setrlimit(resource.RLIMIT_NOFILE, (room, room))  # hard too: no lifting it back
    for i in range(1, 200):
        try:
            py.execute("x = 1", session_id=f"s{i}")
        except InfrastructureError as exc:
            assert exc.retryable and "ulimit -n" in exc.message, exc
            print("refused", i)
            break
    else:
        raise SystemExit("never ran out")
    assert py.execute("print(x)", session_id="s0").stdout == "0\\n"  # live ones still work
"""


def test_running_out_of_descriptors_is_a_retryable_infrastructure_error() -> None:
    import subprocess
    import sys

    proc = subprocess.run(
        [sys.executable, "-c", _OUT_OF_FDS], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0 and "refused" in proc.stdout, proc.stderr[-2000:]
