"""Fixtures of the parser tests."""

from __future__ import annotations

from types import ModuleType

import pytest


@pytest.fixture(scope="session")
def torchrl_tools() -> ModuleType:
    """TorchRL's tool transforms module, for side-by-side tests (skips without the extra)."""
    return pytest.importorskip("torchrl.envs.llm.transforms.tools")
