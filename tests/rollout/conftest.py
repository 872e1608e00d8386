"""The rollout tests need the openai SDK and the loopback server's uvicorn and starlette."""

from __future__ import annotations

import pytest

pytest.importorskip("openai")
pytest.importorskip("uvicorn")
pytest.importorskip("starlette")
