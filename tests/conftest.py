"""Suite-wide fixtures: async tests run on anyio's asyncio backend."""

from __future__ import annotations

import signal
from collections.abc import Iterator

import pytest


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def sigint_raises_keyboard_interrupt() -> Iterator[None]:
    """SIGINT raises ``KeyboardInterrupt`` in the main thread during the test.

    Python installs that handler only when SIGINT was not ignored at start-up, and a
    shell that ignores SIGINT (a background job, ``nohup``, some CI runners) passes
    the ignored disposition on: a test that sends itself SIGINT installs the handler
    it relies on, and puts the inherited one back afterwards.
    """
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
