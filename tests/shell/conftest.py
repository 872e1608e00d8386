"""Fixtures for the shell tests: one shared service per module, fresh session ids."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from toolservices.shell import ShellService


@pytest.fixture(scope="module")
def shell() -> Iterator[ShellService]:
    """A small pool with short limits: hostile commands stay cheap even if a layer is missing."""
    svc = ShellService(pool_size=2, timeout=10.0, max_output=64 * 1024, max_sessions=32)
    try:
        yield svc
    finally:
        svc.close()


@pytest.fixture
def sid() -> str:
    return f"s-{uuid.uuid4().hex[:8]}"
