"""Hostile snippets against the sandbox layers, level by level.

Each snippet runs in a session forked by a minimal fork server started under a
real ``plan_server_launch`` plan (``_sandbox_selftest``), so these tests do
not depend on the executor. Each assertion names the layer it relies on and
skips, with the report's reason, when that layer is not active at the level
under test. Every snippet is bounded (fork and disk loops have hard caps,
children sleep for a few seconds at most), so a failed layer cannot harm the
machine.
"""

from __future__ import annotations

import json
import os
import secrets
import socket
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import psutil
import pytest
from tests.python.conftest import wait_until_gone

from toolservices.python.runtime._launch import __file__ as LAUNCHER
from toolservices.python.sandbox import SandboxConfig
from toolservices.python.sandbox._probe import pids_of_uid
from toolservices.python.sandbox._snippets import run_snippets

pytestmark = pytest.mark.timeout(240)

IS_ROOT = os.geteuid() == 0
UNPRIVILEGED_UID = 60999  # outside the sandbox's own uid range
MARK = f"SBXMARK_{secrets.token_hex(4)}"
SECRET = secrets.token_hex(16)
LIMITS = {
    "memory_limit": 1 << 30,
    "file_size": 16 << 20,
    "nproc": 48,
    "cpu_seconds": 20,
    "open_files": 64,
}


@dataclass
class Host:
    secret_file: str
    canary_dir: str
    listener: socket.socket
    port: int
    pid: int


def _snippets(host: Host) -> dict[str, dict[str, Any]]:
    return {
        "env": {"code": "import os; print('SECRET', os.environ.get('SANDBOX_TEST_SECRET'))"},
        "identity": {
            "code": (
                "import os\n"
                "status = open('/proc/self/status').read()\n"
                "print('UID', os.getuid())\n"
                "print('NNP', status.split('NoNewPrivs:')[1].split()[0])\n"
                "print('CWD', os.getcwd())\n"
            )
        },
        "control": {
            "code": (
                "import json, threading, os\n"
                "open('own.txt', 'w').write('ok')\n"
                "out = []\n"
                "ts = [threading.Thread(target=out.append, args=(i,)) for i in range(8)]\n"
                "[t.start() for t in ts]; [t.join() for t in ts]\n"
                "print('CONTROL', open('own.txt').read(), len(out), json.dumps([1]))\n"
            )
        },
        "write_outside": {
            "code": (
                f"import os\n"
                f"for path in ({host.canary_dir + '/' + MARK!r}, '/work/{MARK}', '/{MARK}'):\n"
                f"    try:\n"
                f"        open(path, 'w').write('x')\n"
                f"        print('WROTE', path)\n"
                f"    except OSError as exc:\n"
                f"        print('DENIED', path, exc.errno)\n"
            )
        },
        "read_secret": {
            "code": (
                f"for path in ({host.secret_file!r}, '/root/.bashrc', '/etc/shadow'):\n"
                f"    try:\n"
                f"        print('READ', path, open(path).read()[:40])\n"
                f"    except OSError as exc:\n"
                f"        print('DENIED', path, exc.errno)\n"
            )
        },
        "parent_environ": {
            "code": (
                f"try:\n"
                f"    print('READ', len(open('/proc/{host.pid}/environ', 'rb').read()))\n"
                f"except OSError as exc:\n"
                f"    print('DENIED', exc.errno)\n"
                f"import os, signal\n"
                f"try:\n"
                f"    os.kill({host.pid}, 0)\n"
                f"    print('SIGNAL reached')\n"
                f"except OSError as exc:\n"
                f"    print('SIGNAL denied', exc.errno)\n"
            )
        },
        "tcp": {
            "code": (
                f"import socket\n"
                f"try:\n"
                f"    s = socket.create_connection(('127.0.0.1', {host.port}), timeout=2)\n"
                f"    print('CONNECTED')\n"
                f"except OSError as exc:\n"
                f"    print('BLOCKED', exc.errno)\n"
            )
        },
        "udp": {
            "code": (
                "import socket\n"
                "try:\n"
                "    socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n"
                "    print('UDP allowed')\n"
                "except OSError as exc:\n"
                "    print('UDP denied', exc.errno)\n"
            )
        },
        "memory": {
            "code": (
                "try:\n"
                "    block = bytearray(2 << 30)\n"
                "    print('ALLOCATED')\n"
                "except MemoryError:\n"
                "    print('MEMORYERROR')\n"
            )
        },
        "fork_bomb": {
            "timeout": 20.0,
            "code": (
                "import os, time\n"
                "kids = []\n"
                "for _ in range(200):\n"
                "    try:\n"
                "        pid = os.fork()\n"
                "    except OSError:\n"
                "        break\n"
                "    if pid == 0:\n"
                "        time.sleep(3)\n"
                "        os._exit(0)\n"
                "    kids.append(pid)\n"
                "print('FORKED', len(kids))\n"
                "for pid in kids:\n"
                "    os.kill(pid, 9)\n"
                "    os.waitpid(pid, 0)\n"
            ),
        },
        "disk_fill": {
            "code": (
                "chunk = b'x' * (1 << 20)\n"
                "written = 0\n"
                "try:\n"
                "    with open('fill.bin', 'wb') as fh:\n"
                "        for _ in range(256):\n"
                "            fh.write(chunk)\n"
                "            fh.flush()\n"
                "            written += 1\n"
                "    print('FILLED', written)\n"
                "except OSError as exc:\n"
                "    print('STOPPED', written, exc.errno)\n"
            )
        },
        "orphan": {
            "code": (
                f"import os, subprocess, sys\n"
                f"if os.fork() == 0:\n"
                f"    subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(20)', "
                f"{MARK!r}], start_new_session=True, stdout=subprocess.DEVNULL, "
                f"stderr=subprocess.DEVNULL)\n"
                f"    os._exit(0)\n"
                f"os.wait()\n"
                f"print('SPAWNED')\n"
            )
        },
        "unshare": {
            "code": (
                "import ctypes, os\n"
                "libc = ctypes.CDLL(None, use_errno=True)\n"
                "rc = libc.unshare(0x10000000 | 0x40000000)  # CLONE_NEWUSER | CLONE_NEWNET\n"
                "print('UNSHARE', rc, ctypes.get_errno())\n"
            )
        },
        "ancestors_environ": {
            "code": (
                "import os\n"
                "pid = os.getppid()\n"
                "while pid > 1:\n"
                "    try:\n"
                "        env = open(f'/proc/{pid}/environ', 'rb').read()\n"
                "        print('LEAK' if b'SANDBOX_TEST_SECRET' in env else 'clean', pid)\n"
                "    except OSError as exc:\n"
                "        print('DENIED', pid, exc.errno)\n"
                "    try:\n"
                "        status = open(f'/proc/{pid}/status').read()\n"
                "    except OSError:\n"
                "        break\n"
                "    pid = int(status.split('PPid:')[1].split()[0])\n"
            )
        },
        "siblings": {
            "code": (
                "import os\n"
                "base = os.path.dirname(os.getcwd())\n"
                "try:\n"
                "    print('LISTED', os.listdir(base), 'OWN', os.path.basename(os.getcwd()))\n"
                "except OSError as exc:\n"
                "    print('DENIED', exc.errno)\n"
            )
        },
        "mp_lock": {"code": "import multiprocessing as mp\nprint('LOCK', mp.Lock())\n"},
        "private_tmp": {"code": (f"open('/tmp/{MARK}', 'w').write('x')\nprint('TMP written')\n")},
    }


@pytest.fixture(scope="module")
def host() -> Iterator[Host]:
    """Host-side bait: an env secret, a 0600 file, a writable dir and a loopback listener."""
    old = os.environ.get("SANDBOX_TEST_SECRET")
    os.environ["SANDBOX_TEST_SECRET"] = SECRET
    secret_file = f"/tmp/sbx_host_secret_{MARK}.txt"
    fd = os.open(secret_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    os.write(fd, SECRET.encode())
    os.close(fd)
    canary_dir = f"/tmp/sbx_canary_{MARK}"
    os.mkdir(canary_dir)
    os.chmod(canary_dir, 0o777)  # DAC allows every uid: only a sandbox layer can refuse
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    listener.setblocking(False)
    try:
        yield Host(secret_file, canary_dir, listener, listener.getsockname()[1], os.getpid())
    finally:
        listener.close()
        os.unlink(secret_file)
        for name in os.listdir(canary_dir):
            os.unlink(os.path.join(canary_dir, name))
        os.rmdir(canary_dir)
        if old is None:
            del os.environ["SANDBOX_TEST_SECRET"]
        else:
            os.environ["SANDBOX_TEST_SECRET"] = old


def _run_unprivileged(
    config: dict[str, Any],
    snippets: dict[str, Any],
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Run the driver as a plain uid, through the sandbox launcher (reaches the venv)."""
    from toolservices.python.sandbox import _probe as probe_mod
    from toolservices.python.sandbox._planner import _launcher_argv

    paths = probe_mod.python_paths(sys.executable)
    reach = probe_mod.reach_groups([(p, True) for p in paths.read_paths], UNPRIVILEGED_UID)
    env = {
        "PATH": "/usr/bin:/bin",
        "LANG": "C.UTF-8",
        "HOME": "/tmp",
        "SANDBOX_TEST_SECRET": SECRET,
    }
    if paths.pythonpath:
        env["PYTHONPATH"] = paths.pythonpath
    spec = {
        "uid": UNPRIVILEGED_UID,
        "gid": UNPRIVILEGED_UID,
        "reach": reach,
        "env": env,
        "argv": [sys.executable, "-m", "toolservices.python.sandbox._snippets"],
    }
    argv = _launcher_argv(spec)
    assert argv[3] == LAUNCHER.replace(".pyc", ".py")
    job = json.dumps({"config": config, "snippets": snippets})
    proc = subprocess.run(
        argv,
        input=job.encode(),
        capture_output=True,
        timeout=180,
        env={"PATH": "/usr/bin:/bin"},
        check=False,
    )
    assert proc.returncode == 0, proc.stderr.decode(errors="replace")[-3000:]
    data = json.loads(proc.stdout)
    return data["report"], data["results"]


VARIANTS = {
    "L3": {},
    "L2": {"bwrap": False},
    "L1": {"bwrap": False, "seccomp": False, "landlock": False},
    "nonroot-L3": {},
    "nonroot-L2": {"bwrap": False},
    "nonroot-L1": {"bwrap": False, "seccomp": False, "landlock": False},
}


@dataclass
class Run:
    variant: str
    report: dict[str, Any]
    results: dict[str, Any]
    leftovers: list[str]
    listener_accepts: int
    canary_written: list[str]
    host_tmp_marked: bool

    def out(self, name: str) -> str:
        return str(self.results[name]["output"])

    def layer(self, name: str) -> dict[str, Any]:
        return dict(self.report["layers"][name])

    def need(self, *names: str) -> None:
        """Skip unless every named layer is active in this run."""
        for name in names:
            layer = self.layer(name)
            if not layer["active"]:
                pytest.skip(f"{self.variant}: layer {name} inactive: {layer.get('why')}")


@pytest.fixture(scope="module", params=list(VARIANTS))
def run(request: pytest.FixtureRequest, host: Host) -> Run:
    variant = request.param
    config = dict(LIMITS, **VARIANTS[variant])
    if variant.startswith("nonroot"):
        if not IS_ROOT:
            pytest.skip("the suite already runs unprivileged: covered by the L3/L2 variants")
        report, results = _run_unprivileged(config, _snippets(host))
    else:
        report, results = run_snippets(SandboxConfig(**config), _snippets(host))
    accepts = 0
    while True:
        try:
            conn, _ = host.listener.accept()
        except BlockingIOError:
            break
        conn.close()
        accepts += 1
    # The kernel tears a PID namespace down asynchronously once bwrap's init dies: give the
    # marked processes a bounded moment to disappear before calling them survivors.
    leftovers = [str(p.pid) for p in wait_until_gone(MARK, within=5.0)]
    for pid in leftovers:  # keep the machine clean even when the assertion below fails
        try:
            os.kill(int(pid), 9)
        except ProcessLookupError:
            continue
    # host-side traces of this run, recorded then removed so the next variant starts clean
    canary_written = sorted(os.listdir(host.canary_dir))
    for name in canary_written:
        os.unlink(os.path.join(host.canary_dir, name))
    host_tmp_marked = os.path.exists(f"/tmp/{MARK}")
    if host_tmp_marked:
        os.unlink(f"/tmp/{MARK}")  # L1 writes the real host /tmp: documented, cleaned here
    return Run(variant, report, results, leftovers, accepts, canary_written, host_tmp_marked)


def test_level_is_reported_as_requested(run: Run) -> None:
    expected = run.variant.rsplit("-", 1)[-1]
    if run.report["level"] != expected:
        pytest.skip(f"{run.variant}: got {run.report['level']}: {run.report['fallbacks']}")
    assert run.report["level"] == expected
    for name, layer in run.report["layers"].items():
        assert layer["active"] or layer.get("why"), f"layer {name} inactive without a reason"


def test_controls_pass(run: Run) -> None:
    """A sandbox that blocks everything is not a sandbox: workdir, threads, imports work."""
    assert "CONTROL ok 8 [1]" in run.out("control"), run.out("control")


def test_environment_secret_invisible(run: Run) -> None:
    """Layer env_allowlist (always)."""
    run.need("env_allowlist")
    assert "SECRET None" in run.out("env")
    assert SECRET not in run.out("env") and SECRET not in run.out("identity")


def test_uid_and_no_new_privs(run: Run) -> None:
    """Layers uid_drop (root) and no_new_privs."""
    run.need("no_new_privs")
    assert "NNP 1" in run.out("identity")
    if IS_ROOT or run.variant.startswith("nonroot"):
        assert "UID 0" not in run.out("identity")


def test_writes_outside_workdir_fail(run: Run, host: Host) -> None:
    """Layer readonly_fs (Landlock at L2, read-only root at L3): even a 0777 host dir is closed."""
    run.need("readonly_fs")
    assert "WROTE" not in run.out("write_outside"), run.out("write_outside")
    assert run.canary_written == []


def test_host_secret_file_unreadable(run: Run) -> None:
    """Layers uid_drop (DAC), readonly_fs or namespaces: a 0600 root file stays closed."""
    if not (IS_ROOT or run.variant.startswith("nonroot")):
        run.need("readonly_fs")
    out = run.out("read_secret")
    assert SECRET not in out
    assert "READ /root/.bashrc" not in out and "READ /etc/shadow" not in out


def test_supervisor_environ_and_signals_out_of_reach(run: Run) -> None:
    """Layers namespaces / Landlock scoping / uid_drop: the supervisor's environ and signals."""
    if run.variant == "L1" and not IS_ROOT:
        run.need("landlock")
    out = run.out("parent_environ")
    assert "READ" not in out, out
    assert "SIGNAL reached" not in out, out


def test_loopback_tcp_blocked(run: Run) -> None:
    """Layer network (empty netns at L3, Landlock TCP + seccomp at L2)."""
    run.need("network")
    assert "CONNECTED" not in run.out("tcp"), run.out("tcp")
    assert run.listener_accepts == 0


def test_udp_sockets_denied(run: Run) -> None:
    """Layer seccomp (denies inet sockets, so UDP too)."""
    run.need("seccomp")
    assert "UDP denied" in run.out("udp"), run.out("udp")


def test_memory_bomb_fails(run: Run) -> None:
    """Layer rlimits (RLIMIT_AS = 1 GiB here)."""
    run.need("rlimits")
    assert "MEMORYERROR" in run.out("memory"), run.out("memory")


def test_fork_bomb_stops_below_cap(run: Run) -> None:
    """Layer nproc_limit (RLIMIT_NPROC = 48 above the caller's own tasks for non-root)."""
    run.need("nproc_limit")
    out = run.out("fork_bomb")
    assert "FORKED" in out, out
    assert int(out.split("FORKED")[1].split()[0]) < 200


def test_disk_fill_stops_at_fsize(run: Run) -> None:
    """Layer rlimits (RLIMIT_FSIZE = 16 MiB): the write fails with EFBIG."""
    run.need("rlimits")
    out = run.out("disk_fill")
    assert "STOPPED 16 27" in out, out  # 27 = EFBIG


def test_orphans_do_not_survive(run: Run) -> None:
    """Layer orphan_cleanup (PID namespace at L3, uid sweep as root at L1/L2)."""
    if run.report["level"] != "L3" and run.report["layers"]["uid_drop"]["active"] is False:
        pytest.skip(f"{run.variant}: only the executor's subreaper cleans up at this level")
    assert "SPAWNED" in run.out("orphan"), run.out("orphan")
    assert run.leftovers == []


def test_private_tmp(run: Run) -> None:
    """Layer private_tmp (L3): /tmp is writable inside and nothing lands on the host."""
    run.need("private_tmp")
    assert "TMP written" in run.out("private_tmp"), run.out("private_tmp")
    assert not run.host_tmp_marked


def test_ancestors_environment_unreadable(run: Run) -> None:
    """Layers namespaces / landlock (ptrace scoping) / uid_drop: no ancestor's environ leaks.

    The unprivileged driver has SANDBOX_TEST_SECRET in its own environment and the same
    uid as its sessions: only a PID namespace or Landlock keeps it out of reach.
    """
    if run.variant == "nonroot-L1" or (run.variant == "L1" and not IS_ROOT):
        pytest.skip("L1 as non-root: processes of the same uid can read each other's /proc")
    out = run.out("ancestors_environ")
    assert "LEAK" not in out, out


def test_other_sessions_workdirs_unreachable(run: Run) -> None:
    """Layer landlock: a session cannot list the base that holds the other sessions' dirs.

    With session namespaces below /tmp (L2) the base it sees is a copy in its own /tmp
    holding only its own directory.
    """
    run.need("landlock")
    out = run.out("siblings")
    if "LISTED" in out and run.report["layers"]["session_namespaces"]["active"]:
        listed, own = out.split("LISTED ", 1)[1].split(" OWN ")
        assert listed == repr([own.strip()]), out
    else:
        assert "DENIED 13" in out, out


def test_new_namespaces_denied(run: Run) -> None:
    """Layer seccomp (unshare denied; at L3 bwrap's --disable-userns as well)."""
    run.need("seccomp")
    assert "UNSHARE -1 1" in run.out("unshare"), run.out("unshare")  # EPERM


def test_fork_bomb_cap_is_the_configured_headroom(run: Run) -> None:
    """Layer nproc_limit: at most about nproc (48) new tasks, far below the bomb's 200."""
    run.need("nproc_limit")
    out = run.out("fork_bomb")
    # a few tasks of slack: the caller's own thread count moves between plan and session
    assert int(out.split("FORKED")[1].split()[0]) <= LIMITS["nproc"] + 8


def test_multiprocessing_locks_work_with_private_shm(run: Run) -> None:
    """Layer private_tmp (L3): /dev/shm is private, so multiprocessing's semaphores work."""
    run.need("private_tmp")
    assert "LOCK <Lock" in run.out("mp_lock"), run.out("mp_lock")


def test_nothing_left_under_the_sandbox_uid(run: Run) -> None:
    """As root, closing the plan leaves no process of the dedicated uid."""
    uid = run.report.get("uid")
    if not IS_ROOT or run.variant.startswith("nonroot") or not uid:
        pytest.skip("only root runs sessions under a dedicated uid")
    procs = []
    for pid in pids_of_uid(uid):
        try:
            procs.append(psutil.Process(pid))
        except psutil.NoSuchProcess:
            continue
    psutil.wait_procs(procs, timeout=5.0)  # sweep and namespace teardown are asynchronous
    left = {}
    for pid in pids_of_uid(uid):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as fh:
                left[pid] = fh.read()[:120]
        except OSError:
            continue
    assert left == {}, f"uid {uid}"
