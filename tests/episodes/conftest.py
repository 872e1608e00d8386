"""One shell service per module for the episode lifecycle tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from toolservices.shell import ShellService


@pytest.fixture(scope="module")
def shell() -> Iterator[ShellService]:
    svc = ShellService(pool_size=2, timeout=20.0, max_sessions=32)
    try:
        yield svc
    finally:
        svc.close()
