"""Fixtures for the Python executor tests: one shared service, process checks."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator

import psutil
import pytest

from toolservices.python import PythonExecutorService


@pytest.fixture(scope="module")
def service() -> Iterator[PythonExecutorService]:
    """A small pool with short limits: hostile snippets stay cheap even if a layer is missing."""
    svc = PythonExecutorService(pool_size=2, timeout=5.0, max_output=64 * 1024, max_sessions=16)
    try:
        yield svc
    finally:
        svc.close()


@pytest.fixture
def sid() -> str:
    return f"t-{uuid.uuid4().hex[:8]}"


@pytest.fixture
def marker() -> str:
    """A token to put in the argv of processes a snippet starts (found by psutil later)."""
    return f"TSMARK_{uuid.uuid4().hex}"


def processes_with(marker: str) -> list[psutil.Process]:
    found = []
    for proc in psutil.process_iter(["cmdline", "status"]):
        try:
            cmdline = proc.info["cmdline"] or []
            if proc.pid != os.getpid() and any(marker in part for part in cmdline):
                found.append(proc)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return found


def wait_until_gone(marker: str, within: float = 5.0) -> list[psutil.Process]:
    """Processes carrying ``marker`` still alive after ``within`` seconds (ideally none)."""
    _gone, alive = psutil.wait_procs(processes_with(marker), timeout=within)
    return [p for p in alive if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
