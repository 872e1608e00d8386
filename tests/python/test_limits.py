"""Runaway recursion and memory: each ends fast, the same way every time, and the next call works.

Recursion of either kind (Python calls, C recursion such as ``repr`` of a
nested list) ends in ``RecursionError`` and the session keeps its state: the
recursion limit is clamped where the stacks hold it (main thread and
threads). Memory is bounded by the address-space limit. Each case runs with a
timeout far above what it needs and asserts it was not reached: before these
limits, a million-deep ``repr`` ran until the timeout.
"""

from __future__ import annotations

import glob
import os
from collections.abc import Iterator

import pytest

from toolservices.errors import UserError
from toolservices.python import ExecResult, PythonExecutorService, SandboxConfig
from toolservices.python.sandbox import _memcg
from toolservices.python.sandbox._config import fast_tmp_dir

RAISED_LIMIT = "import sys\nsys.setrecursionlimit(10**6)\n"
NESTED = "x = []\nfor _ in range(10**6):\n    x = [x]\n"
NESTED_DICT = "x = {}\nfor _ in range(10**6):\n    x = {1: x}\n"
#: a class whose __repr__ and __eq__ recurse into a child: Python -> C -> Python per level
NODES = (
    "class N:\n    def __init__(self, c):\n        self.c = c\n"
    "    def __repr__(self):\n        return 'N(' + repr(self.c) + ')'\n"
    "    def __eq__(self, o):\n        return self.c == o.c\n    __hash__ = None\n"
    "x = y = None\nfor _ in range(10**6):\n    x, y = N(x), N(y)\n"
)
CAP = 30_000  # the clamp on sys.setrecursionlimit (runtime/_worker.py, docs/sandbox.md)
GENEROUS = 60.0  # seconds: each case needs a few at most, even on a loaded 2-core machine


def _next_call_works(service: PythonExecutorService, sid: str, result: ExecResult) -> None:
    """The session answers after ``result``; its state survived unless the result said so."""
    after = service.execute("print(kept)", session_id=sid)
    if result.restarted:
        assert after.exception is not None and after.exception.type == "NameError", after
    else:
        assert after.stdout == "1\n", after
    assert service.execute("print(2 + 2)", session_id=sid).stdout == "4\n"
    service.close_session(sid)


# --- Python recursion: the cap on sys.setrecursionlimit ----------------------------------


@pytest.mark.parametrize("limit", [10**6, 10**9])
def test_python_recursion_ends_in_recursion_error(
    service: PythonExecutorService, sid: str, limit: int
) -> None:
    service.execute("kept = 1", session_id=sid)
    code = f"import sys\nsys.setrecursionlimit({limit})\ndef f(n):\n    return f(n + 1)\nf(0)"
    result = service.execute(code, session_id=sid, timeout=GENEROUS)
    assert not result.timed_out and not result.restarted, result.stderr[-500:]
    assert result.exception is not None and result.exception.type == "RecursionError", result
    assert "earlier frames not shown" in result.stderr and len(result.stderr) < 50_000
    honoured = service.execute("print(sys.getrecursionlimit())", session_id=sid)
    assert int(honoured.stdout) == CAP
    _next_call_works(service, sid, result)


def test_a_limit_below_the_cap_is_honoured(service: PythonExecutorService, sid: str) -> None:
    code = "import sys\nsys.setrecursionlimit(12_345)\nprint(sys.getrecursionlimit())"
    assert service.execute(code, session_id=sid).stdout == "12345\n"
    service.close_session(sid)


def test_deep_traceback_is_cut_to_its_innermost_frames(
    service: PythonExecutorService, sid: str
) -> None:
    code = RAISED_LIMIT + "def f(n):\n    return f(n + 1) if n < 5000 else 1 / 0\nf(0)"
    result = service.execute(code, session_id=sid)
    assert result.exception is not None and result.exception.type == "ZeroDivisionError"
    assert "[... 4902 earlier frames not shown ...]" in result.stderr
    assert result.stderr.count("line 5, in f") <= 2  # repeats folded, tail only
    assert result.stderr.rstrip().endswith("ZeroDivisionError: division by zero")
    service.close_session(sid)


# --- C recursion: the same cap, within stacks that hold it -------------------------------

C_RECURSION = [
    pytest.param(NESTED + "repr(x)", id="repr-list"),
    pytest.param(NESTED + "str(x)", id="str-list"),
    pytest.param(NESTED + "import json\njson.dumps(x)", id="json-list"),
    pytest.param(NESTED + "import pickle\npickle.dumps(x)", id="pickle-list"),
    pytest.param(NESTED + "y = []\nfor _ in range(10**6):\n    y = [y]\nx == y", id="eq-list"),
    pytest.param(NESTED + "import copy\ncopy.deepcopy(x)", id="deepcopy-list"),
    pytest.param(NESTED_DICT + "repr(x)", id="repr-dict"),
    pytest.param(NESTED_DICT + "import json\njson.dumps(x)", id="json-dict"),
    pytest.param(NESTED_DICT + "import pickle\npickle.dumps(x)", id="pickle-dict"),
    pytest.param(
        NESTED_DICT + "y = {}\nfor _ in range(10**6):\n    y = {1: y}\nx == y", id="eq-dict"
    ),
    pytest.param(NESTED_DICT + "import copy\ncopy.deepcopy(x)", id="deepcopy-dict"),
    pytest.param(NODES + "repr(x)", id="class-repr"),
    pytest.param(NODES + "x == y", id="class-eq"),
    pytest.param(
        "import functools\n@functools.lru_cache(None)\n"
        "def g(n):\n    return 0 if n == 0 else g(n - 1) + 1\ng(10**6)",
        id="lru-cache",
    ),
]


@pytest.mark.parametrize("operation", C_RECURSION)
def test_deep_c_recursion_ends_in_recursion_error_and_the_session_keeps_its_state(
    service: PythonExecutorService, sid: str, operation: str
) -> None:
    """Before: ``repr`` ran until the timeout; with an 8 MiB stack (500,000 clamp) all crashed."""
    service.execute("kept = 1", session_id=sid)
    code = "import sys\nsys.setrecursionlimit(10**9)\n" + operation
    result = service.execute(code, session_id=sid, timeout=GENEROUS)
    assert not result.timed_out and not result.restarted, result.stderr[-500:]
    assert result.exception is not None and result.exception.type == "RecursionError", result
    _next_call_works(service, sid, result)


def _in_a_thread(body: str, stack_size: int | None) -> str:
    """``body`` run in a thread the code starts; prints what it raised."""
    lines = "".join(f"        {line}\n" for line in body.splitlines())
    size = "" if stack_size is None else f"threading.stack_size({stack_size})\n"
    return (
        f"import sys, threading\nsys.setrecursionlimit(10**9)\n{size}raised = []\n"
        f"def run():\n    try:\n{lines}    except BaseException as exc:\n"
        "        raised.append(type(exc).__name__)\n"
        "t = threading.Thread(target=run)\nt.start()\nt.join()\nprint(*raised)"
    )


@pytest.mark.parametrize("stack_size", [None, 32768, 1 << 30], ids=["default", "tiny", "huge"])
@pytest.mark.parametrize(
    "operation",
    [
        pytest.param("def f(n):\n    return f(n + 1)\nf(0)", id="python"),
        pytest.param(NESTED + "repr(x)", id="repr-list"),
        pytest.param(NESTED_DICT + "import json\njson.dumps(x)", id="json-dict"),
        pytest.param(NESTED + "y = []\nfor _ in range(10**6):\n    y = [y]\nx == y", id="eq"),
        pytest.param(NODES + "repr(x)", id="class-repr"),
        pytest.param(NODES + "x == y", id="class-eq"),
    ],
)
def test_deep_recursion_in_a_thread_ends_in_recursion_error(
    service: PythonExecutorService, sid: str, operation: str, stack_size: int | None
) -> None:
    """Whatever ``threading.stack_size`` the code sets, the thread holds the cap."""
    service.execute("kept = 1", session_id=sid)
    code = _in_a_thread(operation, stack_size)
    result = service.execute(code, session_id=sid, timeout=GENEROUS)
    assert not result.timed_out and not result.restarted, result.stderr[-500:]
    assert result.exception is None and result.stdout == "RecursionError\n", result
    _next_call_works(service, sid, result)


def test_c_recursion_within_the_cap_still_works(service: PythonExecutorService) -> None:
    code = (
        "import json, sys\nsys.setrecursionlimit(100_000)\nx = []\nfor _ in range(20_000):\n"
        "    x = [x]\nprint(len(repr(x)), len(json.dumps(x)), x == x)"
    )
    result = service.execute(code, timeout=GENEROUS)
    assert result.stdout == "40002 40002 True\n", result


def test_thread_stacks_are_clamped_between_the_default_and_the_main_stack(
    service: PythonExecutorService,
) -> None:
    code = (
        "import resource, threading\nprint(resource.getrlimit(resource.RLIMIT_STACK)[0] >> 20)\n"
        "threading.stack_size(1 << 30)\nprint(threading.stack_size(32768) >> 20)\n"
        "print(threading.stack_size() >> 20)\nprint(threading.stack_size())"
    )
    assert service.execute(code).stdout == "128\n128\n32\n0\n"


def test_a_stack_overflow_the_cap_does_not_catch_is_a_clean_restart(
    service: PythonExecutorService, sid: str
) -> None:
    """``select`` keeps ~50 KB of fd tables on the stack per call: 2,600 levels fill 128 MiB."""
    code = (
        "import select, sys\nsys.setrecursionlimit(10**6)\nclass F:\n    def fileno(self):\n"
        "        select.select([F()], [], [], 0)\n        return 0\nselect.select([F()], [], [], 0)"
    )
    service.execute("kept = 1", session_id=sid)
    result = service.execute(code, session_id=sid, timeout=GENEROUS)
    assert not result.timed_out and result.restarted and result.returncode == -11, result
    assert result.exception is not None and result.exception.type == "InterpreterExit"
    assert "C stack" in result.exception.message
    assert "Fatal Python error: Segmentation fault" in result.stderr
    _next_call_works(service, sid, result)


def test_a_smaller_stack_lowers_the_cap_so_recursion_still_ends_in_recursion_error() -> None:
    """``stack_size=8 MiB`` (the old default): the clamp follows the stack, 1,875 levels."""
    eq_in_a_thread = _in_a_thread(NODES + "x == y", 1 << 30).replace("10**9", "10**6")
    with PythonExecutorService(
        pool_size=1, timeout=GENEROUS, sandbox=SandboxConfig(stack_size=8 << 20)
    ) as svc:
        svc.execute("kept = 1", session_id="small")
        result = svc.execute(RAISED_LIMIT + NODES + "x == y", session_id="small")
        assert result.exception is not None and result.exception.type == "RecursionError", result
        assert svc.execute("print(sys.getrecursionlimit())", session_id="small").stdout == "1875\n"
        assert svc.execute(eq_in_a_thread, session_id="small").stdout == "RecursionError\n"
        _next_call_works(svc, "small", result)


@pytest.mark.parametrize("size", [0, 4096, (1 << 20) - 1])
def test_a_stack_too_small_for_python_is_refused_at_construction(size: int) -> None:
    with pytest.raises(UserError, match="stack_size"):
        SandboxConfig(stack_size=size)


def test_the_report_lists_the_stack_and_memory_limits(service: PythonExecutorService) -> None:
    detail = service.isolation_report()["layers"]["rlimits"]["detail"]
    assert f"STACK={128 << 20}" in detail and f"AS={2 << 30}" in detail


# --- memory: one address-space limit counts private and shared mappings alike -----------------

SHARED_2G = (
    "import mmap\ntry:\n"
    "    m = mmap.mmap(-1, 2 << 30, flags=mmap.MAP_SHARED | mmap.MAP_ANONYMOUS)\n"
    "    for i in range(0, len(m), 4096):\n        m[i] = 1\n    print('TOUCHED')\n"
    "except OSError as exc:\n    print('REFUSED', exc.errno)"
)


def test_a_2_gib_shared_mapping_is_refused_every_time(
    service: PythonExecutorService, sid: str
) -> None:
    """Refused when mapped (ENOMEM), before any page is touched: no race with the timeout."""
    outcomes = [service.execute(SHARED_2G, timeout=GENEROUS) for _ in range(3)]
    service.execute("kept = 1", session_id=sid)
    outcomes += [service.execute(SHARED_2G, session_id=sid, timeout=GENEROUS) for _ in range(3)]
    for result in outcomes:
        assert result.stdout == "REFUSED 12\n" and not result.timed_out, result
        assert not result.restarted
    _next_call_works(service, sid, outcomes[-1])


def test_shared_and_private_mappings_share_one_budget(service: PythonExecutorService) -> None:
    code = (
        "import mmap\n"
        "shared = mmap.mmap(-1, 1200 << 20, flags=mmap.MAP_SHARED | mmap.MAP_ANONYMOUS)\n"
        "try:\n    private = mmap.mmap(-1, 1200 << 20)\n    print('BOTH')\n"
        "except OSError as exc:\n    print('SECOND REFUSED', exc.errno)\n"
        "del shared\nprivate = mmap.mmap(-1, 1200 << 20)\nprint('ONE AT A TIME')"
    )
    assert service.execute(code).stdout == "SECOND REFUSED 12\nONE AT A TIME\n"


def test_memfd_is_capped_like_a_file_and_its_mapping_counts(
    service: PythonExecutorService, sid: str
) -> None:
    code = (
        "import mmap, os\nfd = os.memfd_create('grow')\nchunk = b'x' * (1 << 20)\nn = 0\n"
        "try:\n    while n < 4096:\n        os.write(fd, chunk)\n        n += 1\n"
        "except OSError as exc:\n    print('WRITE STOPPED', exc.errno, n)\n"
        "try:\n    os.ftruncate(fd, 2 << 30)\n"
        "except OSError as exc:\n    print('GROW REFUSED', exc.errno)\n"
        "big = os.memfd_create('map')\n"
        "try:\n    mmap.mmap(big, 2 << 30, flags=mmap.MAP_SHARED)\n"
        "except (OSError, ValueError) as exc:\n    print('MAP REFUSED')\n"
    )
    service.execute("kept = 1", session_id=sid)
    result = service.execute(code, session_id=sid, timeout=GENEROUS)
    assert result.stdout == "WRITE STOPPED 27 64\nGROW REFUSED 27\nMAP REFUSED\n", result
    _next_call_works(service, sid, result)


# --- memory: one cgroup per session, where the host allows it -----------------------------

GROUP_LIMIT = 512 << 20


@pytest.fixture(scope="module")
def small() -> Iterator[PythonExecutorService]:
    """An executor whose sessions get 512 MiB: the cases fill just over it.

    Its working directories are on tmpfs, as the default puts them when it can.
    """
    config = _on_tmpfs(memory_limit=GROUP_LIMIT)
    with PythonExecutorService(pool_size=1, timeout=GENEROUS, sandbox=config) as svc:
        if not svc.isolation_report()["layers"]["memory_cgroup"]["active"]:
            pytest.skip(svc.isolation_report()["layers"]["memory_cgroup"]["why"])
        yield svc


def _on_tmpfs(**limits: int) -> SandboxConfig:
    base = fast_tmp_dir()
    if base is None:
        pytest.skip("no writable tmpfs for the working directories")
    return SandboxConfig(base_dir=base, **limits)


def _killed_for_memory(result: ExecResult) -> bool:
    return (
        result.exception is not None
        and result.exception.type == "InterpreterExit"
        and "memory limit" in result.exception.message
        and result.returncode == -9
        and not result.timed_out
    )


@pytest.mark.parametrize(
    "code",
    [
        pytest.param(
            "import os\nfds = []\nfor _ in range(24):\n    fds.append(os.memfd_create('m'))\n"
            "    for _ in range(32):\n        os.write(fds[-1], b'x' * (1 << 20))\nprint('KEPT')",
            id="memfd",
        ),
        pytest.param(
            "for i in range(24):\n    with open(f'f{i}', 'wb') as fh:\n"
            "        for _ in range(32):\n            fh.write(b'x' * (1 << 20))\nprint('KEPT')",
            id="workdir-files",
        ),
    ],
)
def test_the_memory_group_counts_files_shared_memory_and_children(
    small: PythonExecutorService, sid: str, code: str
) -> None:
    """Each stays under the address-space limit but goes over the group's."""
    small.execute("kept = 1", session_id=sid)
    result = small.execute(code, session_id=sid)
    assert _killed_for_memory(result) and result.restarted, result
    _next_call_works(small, sid, result)


def test_the_memory_group_counts_a_sessions_processes_together(
    small: PythonExecutorService, sid: str
) -> None:
    """Two children of 300 MiB each, each under the address-space limit: one is killed."""
    code = (
        "import os\ngo_r, go_w = os.pipe()\n"
        "def hog():\n    r, w = os.pipe()\n    pid = os.fork()\n    if pid == 0:\n"
        "        n = bytearray(300 << 20)\n        for i in range(0, len(n), 4096):\n"
        "            n[i] = 1\n        os.write(w, b'x')\n        os.read(go_r, 1)\n"
        "        os._exit(0)\n    os.close(w)\n    os.read(r, 1)  # ready, or EOF if killed\n"
        "    return pid\n"
        "pids = [hog(), hog()]\nos.write(go_w, b'xx')\n"
        "print(sorted(os.waitstatus_to_exitcode(os.waitpid(p, 0)[1]) for p in pids))"
    )
    small.execute("kept = 1", session_id=sid)
    result = small.execute(code, session_id=sid)
    assert result.stdout == "[-9, 0]\n" or _killed_for_memory(result), result
    _next_call_works(small, sid, result)


def test_under_the_limit_nothing_is_killed(small: PythonExecutorService) -> None:
    code = (
        "import os\nfd = os.memfd_create('m')\nfor _ in range(60):\n"
        "    os.write(fd, b'x' * (1 << 20))\nprint('KEPT')"
    )
    assert small.execute(code).stdout == "KEPT\n"


def test_memory_groups_are_removed_with_their_sessions_and_executor() -> None:
    own, _why = _memcg.own_group()
    pattern = os.path.join(own or "/nonexistent", f"toolservices-memcg-{os.getpid()}-*")
    before = set(glob.glob(pattern))  # other executors of this process keep theirs
    config = SandboxConfig(memory_limit=GROUP_LIMIT)
    with PythonExecutorService(pool_size=1, spares=0, sandbox=config) as svc:
        if not svc.isolation_report()["layers"]["memory_cgroup"]["active"]:
            pytest.skip(svc.isolation_report()["layers"]["memory_cgroup"]["why"])
        svc.execute("x = 1", session_id="one")
        (executor_group,) = set(glob.glob(pattern)) - before
        assert len(_groups(executor_group)) == 1
        svc.close_session("one")
        assert _groups(executor_group) == []
    assert not os.path.exists(executor_group)


def _groups(path: str) -> list[str]:
    return [e.name for e in os.scandir(path) if e.is_dir(follow_symlinks=False)]


def test_a_session_cannot_raise_its_memory_limit_or_leave_its_group(
    service: PythonExecutorService,
) -> None:
    layers = service.isolation_report()["layers"]
    for layer in ("memory_cgroup", "landlock"):
        if not layers[layer]["active"]:
            pytest.skip(f"layer {layer} off: {layers[layer]['why']}")
    code = (
        "import os\nrel = [line.split(':', 2)[2] for line in open('/proc/self/cgroup')\n"
        "       if line.split(':')[1] == 'memory'][0].strip()\n"
        "name = os.path.basename(rel)\n"
        "for group in ('/run/toolservices-memcg/' + name, '/sys/fs/cgroup/memory' + rel):\n"
        "    for leaf, text in (('memory.memsw.limit_in_bytes', '-1'),\n"
        "                       ('memory.limit_in_bytes', '-1'), ('cgroup.procs', '0')):\n"
        "        try:\n            with open(os.path.join(group, leaf), 'w') as fh:\n"
        "                fh.write(text)\n            print('WROTE', leaf)\n"
        "        except OSError:\n            pass\n"
        "    try:\n        os.mkdir(os.path.join(os.path.dirname(group), 'escape'))\n"
        "        print('MADE A GROUP')\n    except OSError:\n        pass\nprint('END')"
    )
    assert service.execute(code).stdout == "END\n"
