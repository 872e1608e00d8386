"""Real toolchains under a shell session's default limits (issue #23, section 2).

A command gets a usual terminal's 8 MiB soft stack (glibc's thread stack size
comes from it) and no address-space limit where the session's memory cgroup
bounds its memory: at the old defaults (128 MiB stacks, RLIMIT_AS 2 GiB) a
JVM could not start, node with 8 workers died in V8's CodeRange and a
program got about 15 threads. Each test skips, saying why, when its
toolchain is not installed (``.ci/run`` installs them).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tarfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from toolservices.shell import ShellService

MORE_ITERTOOLS = "more-itertools==11.2.1"


def need(*tools: str) -> None:
    missing = [t for t in tools if shutil.which(t) is None]
    if missing:
        pytest.skip(f"{', '.join(missing)} not installed (.ci/run installs it)")


@pytest.fixture(scope="module")
def shell() -> Iterator[ShellService]:
    with ShellService(pool_size=2, timeout=150.0, max_sessions=16) as svc:
        yield svc


@pytest.fixture
def sid(shell: ShellService) -> Iterator[str]:
    session = f"tc-{uuid.uuid4().hex[:8]}"
    yield session
    shell.close_session(session)


def memory_cgroup(shell: ShellService) -> bool:
    return bool(shell.isolation_report()["layers"]["memory_cgroup"]["active"])


def test_commands_get_a_terminals_limits_and_ulimit_persists(shell: ShellService, sid: str) -> None:
    res = shell.run("ulimit -S -s; ulimit -v", session_id=sid)
    stack, space = res.stdout.split()
    assert stack == "8192"
    if memory_cgroup(shell):
        assert space == "unlimited"
    shell.run("ulimit -S -s 16384; ulimit -S -n 100", session_id=sid)
    assert shell.run("ulimit -S -s; ulimit -S -n", session_id=sid).stdout.split() == [
        "16384",
        "100",
    ]
    # the session's hard limit still bounds it
    raised = shell.run("ulimit -S -s 1048576", session_id=sid)
    assert raised.returncode != 0 and "ulimit" in raised.stderr


def test_java_runs(shell: ShellService, sid: str) -> None:
    need("java", "javac")
    res = shell.run("java -version", session_id=sid)
    assert res.returncode == 0, res.stderr
    assert "version" in res.stderr
    source = """
public class Hello {
    public static void main(String[] args) throws Exception {
        Thread[] threads = new Thread[16];
        for (int i = 0; i < threads.length; i++) {
            threads[i] = new Thread(() -> {});
            threads[i].start();
        }
        for (Thread t : threads) t.join();
        System.out.println("hello from java, " + threads.length + " threads");
    }
}
"""
    shell.write_file("Hello.java", source, session_id=sid)
    res = shell.run("javac Hello.java && java Hello", session_id=sid)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "hello from java, 16 threads"


def test_node_with_eight_workers(shell: ShellService, sid: str) -> None:
    need("node")
    script = """
const { Worker } = require('worker_threads');
let done = 0;
for (let i = 0; i < 8; i++) {
  const w = new Worker('require("worker_threads").parentPort.postMessage(6 * 7)', { eval: true });
  w.on('message', (v) => { if (++done === 8) console.log('workers', done, v); });
  w.on('error', (e) => { console.error(e); process.exit(1); });
}
"""
    shell.write_file("workers.js", script, session_id=sid)
    res = shell.run("node workers.js", session_id=sid)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "workers 8 42"


def test_python_with_200_threads(shell: ShellService, sid: str) -> None:
    code = """
import threading
gate = threading.Barrier(201)
threads = [threading.Thread(target=gate.wait) for _ in range(200)]
for t in threads:
    t.start()
gate.wait()
for t in threads:
    t.join()
print("threads", len(threads))
"""
    shell.write_file("threads.py", code, session_id=sid)
    res = shell.run("python3 threads.py", session_id=sid)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "threads 200"


def _tests_cache() -> Path:
    """The tests' download cache (as for the MCP conformance suite)."""
    from tests.mcp._conformance import cache_dir

    return cache_dir()


@pytest.fixture(scope="module")
def more_itertools_sdist() -> Path:
    """The more-itertools sdist, unpacked in the tests' cache (downloaded from the index once)."""
    root = _tests_cache() / "more-itertools-11.2.1"
    tree = root / "more_itertools-11.2.1"
    if (tree / "tests").is_dir():
        return tree
    root.mkdir(parents=True, exist_ok=True)
    command = [
        sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
        MORE_ITERTOOLS, "-d", str(root), "--timeout", "15", "--retries", "1", "-q",
    ]  # fmt: skip
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)
    except subprocess.TimeoutExpired:
        pytest.skip(f"the package index did not answer in 60 s: cannot get {MORE_ITERTOOLS}")
    archives = sorted(root.glob("more_itertools-11.2.1.tar.gz"))
    if done.returncode != 0 or not archives:
        pytest.skip(f"cannot download {MORE_ITERTOOLS} (index unreachable?): {done.stderr[-300:]}")
    with tarfile.open(archives[0]) as archive:
        archive.extractall(root, filter="data")
    return tree


@pytest.mark.timeout(240)
def test_more_itertools_suite_passes_in_a_session(
    shell: ShellService, sid: str, more_itertools_sdist: Path
) -> None:
    for sub in ("more_itertools", "tests"):
        for path in sorted((more_itertools_sdist / sub).iterdir()):
            if path.is_file():
                text = path.read_text(encoding="utf-8")
                shell.write_file(f"{sub}/{path.name}", text, session_id=sid)
    res = shell.run("python3 -m unittest discover -s tests -t . 2>&1 | tail -5", session_id=sid)
    assert res.returncode == 0
    assert "OK" in res.stdout.splitlines()[-1], res.stdout
