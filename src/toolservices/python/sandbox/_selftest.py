"""A live self-test of the sandbox on this machine (``toolservices sandbox-check --self-test``).

The report says which layers *should* be on; this runs a handful of bounded
hostile snippets through the real executor (a :class:`PythonExecutorService`
with the given settings, each snippet in a fresh interpreter forked by its
fork server) and says whether each layer *held*. Limits
are lowered for the run (512 MiB address space, 8 MiB files, 32 extra tasks)
so that a failing layer cannot hurt the machine: the memory bomb asks for
1 GiB, the memfds hold 768 MiB, the fork loop stops at 100, the disk fill at
32 MiB.

The sandbox sits below the executor, so the caller passes the function that
runs the snippets (``run_checks``); ``toolservices.python.self_test`` passes
the executor's (``host/_selftest.py``).
"""

from __future__ import annotations

import dataclasses
import os
import secrets
import shutil
import socket
import tempfile
from collections.abc import Callable, Mapping
from typing import Any

from toolservices.python.sandbox._config import SandboxConfig
from toolservices.python.sandbox._planner import _FIXED_ENV

__all__ = ["CheckRunner", "format_self_test", "self_test"]

#: runs each named snippet in a fresh sandboxed interpreter under the given settings;
#: returns (the isolation report of that run, each snippet's stdout + stderr by name)
CheckRunner = Callable[
    [SandboxConfig, Mapping[str, str], float], tuple[dict[str, Any], dict[str, str]]
]

#: per snippet: the fork loop's children sleep 2 s, a cold start under load takes a few
CHECK_TIMEOUT = 60.0

#: Variables every session may see whatever the allowlist: the plan's fixed ones, the
#: per-server ones, and what the interpreter sets itself.
_FIXED = set(_FIXED_ENV) | {
    "HOME",
    "TMPDIR",
    "TOOLSERVICES_WORKDIR_BASE",
    "PYTHONPATH",
    "PWD",
    "LC_CTYPE",
}


@dataclasses.dataclass(frozen=True)
class _Check:
    name: str
    layer: str
    code: str
    verdict: Callable[[str], bool]
    #: a SandboxConfig field that turns the check off when None (e.g. memory_limit)
    setting: str = ""


def _checks(secret_file: str, open_dir: str, port: int, allowed_env: set[str]) -> list[_Check]:
    return [
        _Check(
            "environment allowlist",
            "env_allowlist",
            "import os; print('ENV', ' '.join(sorted(os.environ)))",
            lambda out: set(out.split("ENV", 1)[1].split()) <= allowed_env,
        ),
        _Check(
            "no_new_privs",
            "no_new_privs",
            "print(open('/proc/self/status').read().split('NoNewPrivs:')[1].split()[0])",
            lambda out: out.strip().endswith("1"),
        ),
        _Check(
            "not running as root",
            "uid_drop",
            "import os; print('UID', os.getuid())",
            lambda out: "UID 0" not in out,
        ),
        _Check(
            "write outside the workdir",
            "readonly_fs",
            f"open({os.path.join(open_dir, 'x')!r}, 'w').write('x')",
            lambda out: not os.listdir(open_dir),
        ),
        _Check(
            "read a 0600 host file",
            "readonly_fs",
            f"print(open({secret_file!r}).read())",
            lambda out: "TOKEN" not in out,
        ),
        _Check(
            "loopback TCP to a host listener",
            "network",
            f"import socket\ntry:\n    socket.create_connection(('127.0.0.1', {port}), 2)\n"
            "    print('CONNECTED')\nexcept OSError as e:\n    print('BLOCKED', e)",
            lambda out: "CONNECTED" not in out,
        ),
        _Check(
            "memory bomb (1 GiB against 512 MiB)",
            "rlimits",
            "try:\n    b = bytearray(1 << 30)\n    print('ALLOCATED')\n"
            "except MemoryError:\n    print('MEMORYERROR')",
            lambda out: "MEMORYERROR" in out,
        ),
        _Check(
            "memory in memfds (768 MiB against 512 MiB)",
            "memory_cgroup",
            "import os\nfds = []\nfor _ in range(128):\n    fds.append(os.memfd_create('m'))\n"
            "    for _ in range(6):\n        os.write(fds[-1], b'x' * (1 << 20))\nprint('KEPT')",
            lambda out: "KEPT" not in out and "SIGKILL" in out,
        ),
        _Check(
            "deep C recursion (repr of a 200,000-deep list)",
            "rlimits",
            "import sys\nsys.setrecursionlimit(10**6)\nx = []\nfor _ in range(200_000):\n"
            "    x = [x]\nrepr(x)\nprint('DONE')",
            lambda out: "RecursionError" in out and "SIGSEGV" not in out,
        ),
        _Check(
            "disk fill (32 MiB against 8 MiB)",
            "rlimits",
            "try:\n    with open('f', 'wb') as f:\n        for _ in range(32):\n"
            "            f.write(b'x' * (1 << 20)); f.flush()\n    print('FILLED')\n"
            "except OSError as e:\n    print('STOPPED', e.errno)",
            lambda out: "STOPPED 27" in out,
        ),
        _Check(
            "fork loop (100 against 32 extra tasks)",
            "nproc_limit",
            "import os, time\nkids = []\nfor _ in range(100):\n    try:\n"
            "        pid = os.fork()\n    except OSError:\n        break\n"
            "    if pid == 0:\n        time.sleep(2)\n        os._exit(0)\n"
            "    kids.append(pid)\nprint('FORKED', len(kids))\n"
            "for pid in kids:\n    os.kill(pid, 9); os.waitpid(pid, 0)",
            lambda out: "FORKED" in out and int(out.split("FORKED")[1].split()[0]) < 100,
        ),
        _Check(
            "an AF_VSOCK socket (crosses network namespaces to a hypervisor's host)",
            "seccomp",
            "import socket\ntry:\n    socket.socket(40, socket.SOCK_STREAM)\n"
            "    print('CREATED')\nexcept OSError as e:\n    print('REFUSED', e.errno)",
            lambda out: "CREATED" not in out,
        ),
        _Check(
            "new user/network namespace",
            "seccomp",
            "import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\n"
            "print('RC', libc.unshare(0x10000000 | 0x40000000))",
            lambda out: "RC -1" in out,
        ),
    ]


def self_test(config: SandboxConfig | None = None, *, run_checks: CheckRunner) -> dict[str, Any]:
    """Run the bounded hostile checks; each is "held", "FAILED" or "skipped" (layer off)."""
    base = config or SandboxConfig()
    config = dataclasses.replace(
        base, memory_limit=512 << 20, file_size=8 << 20, nproc=32, cpu_seconds=20
    )
    workdir = tempfile.mkdtemp(prefix="toolservices-selftest-")
    listener = socket.socket()
    try:
        os.chmod(workdir, 0o755)
        secret_file = os.path.join(workdir, "secret.txt")
        fd = os.open(secret_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        os.write(fd, f"TOKEN {secrets.token_hex(8)}".encode())
        os.close(fd)
        open_dir = os.path.join(workdir, "open")
        os.mkdir(open_dir)
        os.chmod(open_dir, 0o777)  # file permissions allow everyone: only a layer can refuse
        listener.bind(("127.0.0.1", 0))
        listener.listen(4)
        allowed = _FIXED | set(config.env_allowlist) | set(config.extra_env)
        checks = _checks(secret_file, open_dir, listener.getsockname()[1], allowed)
        wanted = [c for c in checks if not (c.setting and getattr(config, c.setting) is None)]
        report, outputs = run_checks(
            config, {check.name: check.code for check in wanted}, CHECK_TIMEOUT
        )
        outcome = []
        for check in checks:
            layer: Mapping[str, Any] = report["layers"][check.layer]
            out = outputs.get(check.name, "")
            if not layer["active"]:
                status, detail = "skipped", f"layer {check.layer} off: {layer.get('why')}"
            elif check.setting and getattr(config, check.setting) is None:
                status, detail = "skipped", f"SandboxConfig({check.setting}=None)"
            elif check.verdict(out):
                status, detail = "held", check.layer
            else:
                status, detail = "FAILED", f"{check.layer}: {out.strip()[-300:]}"
            outcome.append({"check": check.name, "status": status, "detail": detail})
        return {
            "level": report["level"],
            "checks": outcome,
            "ok": all(c["status"] != "FAILED" for c in outcome),
        }
    finally:
        listener.close()
        shutil.rmtree(workdir, ignore_errors=True)


def format_self_test(result: Mapping[str, Any]) -> str:
    """Human-readable rendering of :func:`self_test`."""
    lines = [
        f"self-test at level {result['level']}: "
        + ("every active layer held" if result["ok"] else "SOME LAYERS FAILED")
    ]
    for check in result["checks"]:
        lines.append(f"  [{check['status']:>7}] {check['check']}  ({check['detail']})")
    return "\n".join(lines)
