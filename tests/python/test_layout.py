"""Where each part runs: the runtime is loaded one way, from this checkout, stdlib only;
both execution routes pass one admission."""

from __future__ import annotations

import ast
import asyncio
import functools
import json
import os
import subprocess
import sys

import anyio
import pytest
from tests._wait import until

from toolservices import _portal
from toolservices.errors import ExecutorBusyError
from toolservices.python import PythonExecutorService
from toolservices.python.runtime import RUNTIME_DIR

INSPECT = (
    "import json, sys\n"
    "runtime = sys.modules['_toolservices_runtime']\n"
    "print(json.dumps({'path': runtime.__path__[0], 'modules': sorted(sys.modules),"
    " 'sys_path': sys.path}))"
)


def test_sessions_load_the_runtime_from_this_checkout_and_nothing_else(
    service: PythonExecutorService,
) -> None:
    """A stale runtime (another checkout's, or the package imported through sys.path)
    would show here: the fork server starts the runtime by the path of this checkout's
    files, and neither toolservices nor a third-party module is loaded in a session."""
    # what the interpreter itself loads at start-up (site's .pth hooks, e.g. _distutils_hack)
    startup = subprocess.run(
        [sys.executable, "-s", "-c", "import sys; print(' '.join(sys.modules))"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    for session_id in (None, "layout"):
        result = service.execute(INSPECT, session_id=session_id)
        assert result.success, result.stderr
        seen = json.loads(result.stdout)
        assert seen["path"] == RUNTIME_DIR
        assert RUNTIME_DIR not in seen["sys_path"]  # private modules are not top-level names
        foreign = [
            name
            for name in seen["modules"]
            if name.split(".")[0] not in sys.stdlib_module_names
            and name not in startup
            and name.split(".")[0] not in ("_toolservices_runtime", "_bootstrap", "__main__")
        ]
        assert foreign == [], foreign
    service.close_session("layout")


#: stdlib modules that register an after-fork hook (``os.register_at_fork``) run in every
#: forked session: threading (subprocess imports it) and random (tempfile imports it)
AT_FORK_MODULES = ("threading", "random", "subprocess", "tempfile")


def test_sessions_inherit_no_module_that_runs_code_after_every_fork(
    service: PythonExecutorService, sid: str
) -> None:
    """Each after-fork hook writes to objects shared with the fork server: 70 pages a
    session for these four (``benchmarks.md``). A snippet can still import them."""
    probe = f"import sys\nprint([m for m in {AT_FORK_MODULES!r} if m in sys.modules])"
    for session_id in (None, sid):
        result = service.execute(probe, session_id=session_id)
        assert result.success and result.stdout == "[]\n", result
    used = service.execute(
        "import tempfile, threading\nprint(tempfile.gettempdir())", session_id=sid
    )
    assert used.success, used.stderr
    assert (
        used.stdout.strip()
        == service.execute("import os; print(os.getcwd())", session_id=sid).stdout.strip()
    )
    service.close_session(sid)


def test_a_direct_call_is_refused_like_any_other_when_the_queue_is_full() -> None:
    """One admission for both routes: while ``max_queue`` calls wait, a sync call on an
    idle session (which the direct route could run at once) is refused too."""

    async def scenario(svc: PythonExecutorService) -> list[object]:
        first = asyncio.ensure_future(svc._execute("import time\ntime.sleep(2)", "busy", None))
        await until(lambda: svc._limiter.in_use >= 1)  # it holds a slot
        second = asyncio.ensure_future(svc._execute("print('second')", "busy", None))
        await until(lambda: svc.stats()["queued"] >= 1)  # it is queued
        direct = functools.partial(svc.execute, "print('idle')", session_id="idle")
        try:
            third: object = await anyio.to_thread.run_sync(direct)
        except ExecutorBusyError as exc:
            third = exc
        return [await first, await second, third]

    with PythonExecutorService(pool_size=2, max_queue=1, timeout=10) as svc:
        assert svc.execute("print('warm')", session_id="idle").stdout == "warm\n"
        first, second, third = _portal.run_sync(scenario, svc)
        assert getattr(first, "success", False) and getattr(second, "stdout", "") == "second\n"
        assert isinstance(third, ExecutorBusyError) and "queue is full" in str(third)
        assert svc.stats()["queued"] == 0
        # with the queue empty again the direct route takes it
        direct_before = svc.stats()["direct_calls"]
        assert svc.execute("print('idle')", session_id="idle").stdout == "idle\n"
        assert svc.stats()["direct_calls"] == direct_before + 1


@pytest.mark.parametrize("name", ["_forkserver", "_launch", "_probe", "_snippets"])
def test_runtime_entry_modules_are_started_by_path(name: str) -> None:
    from toolservices.python import runtime

    path = runtime.script(name)
    with open(path, encoding="utf-8") as fh:
        source = fh.read()
    assert (
        "import _bootstrap" in source and "from toolservices" not in source.split("if __name__")[1]
    )


def test_runtime_modules_import_only_the_standard_library_and_each_other() -> None:
    """Every import in runtime/, at any depth (lazy ones too), is relative or of a
    standard-library module: the processes it runs in carry nothing else. (The import
    contract in pyproject.toml checks the same for toolservices' own packages.)"""
    foreign = []
    for name in sorted(os.listdir(RUNTIME_DIR)):
        if not name.endswith(".py"):
            continue
        path = os.path.join(RUNTIME_DIR, name)
        with open(path, encoding="utf-8") as fh:
            tree = ast.parse(fh.read(), path)
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                modules = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                modules = [node.module or ""]
            else:
                continue
            for module in modules:
                top = module.split(".")[0]
                if top not in sys.stdlib_module_names and top != "_bootstrap":
                    foreign.append(f"{name}:{node.lineno}: {module}")
    assert foreign == []
