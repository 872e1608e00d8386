"""The trainer adapters never make `import toolservices` (or the TRL adapter) load a trainer."""

from __future__ import annotations

import subprocess
import sys

import pytest

from toolservices.errors import UserError


def test_importing_toolservices_and_the_trl_adapter_loads_no_trainer():
    code = (
        "import sys, toolservices, toolservices.trainers, toolservices.trainers.trl\n"
        "loaded = [m for m in ('trl', 'verifiers', 'verl', 'transformers', 'torch') "
        "if m in sys.modules]\n"
        "print(','.join(loaded))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    )
    assert out.stdout.strip() == ""


def test_the_adapters_need_a_tool_and_a_positive_timeout():
    from toolservices.trainers.trl import trl_environment

    with pytest.raises(UserError, match="at least one tool"):
        trl_environment([])

    def echo(text: str) -> str:
        """Say it back."""
        return text

    with pytest.raises(UserError, match="timeout"):
        trl_environment([echo], timeout=0)
