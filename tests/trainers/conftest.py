"""Fixtures the trainer adapters' tests share."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest


@pytest.fixture
def executor() -> Iterator[Any]:
    """A small executor; the test fails if an adapter left a Python session open."""
    # imported here: each adapter's test module imports toolservices in its own way
    # (test_verifiers under a warnings filter), after checking its trainer is installed
    from toolservices import PythonExecutorService

    with PythonExecutorService(pool_size=2, timeout=2.0) as ex:
        yield ex
        assert ex.stats()["sessions"] == 0, "an adapter leaked a Python session"
