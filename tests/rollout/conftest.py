"""The rollout tests need the openai SDK and the loopback server's uvicorn and starlette."""

from __future__ import annotations

from tests._extras import missing, skip_every_module

REASON = missing("openai", "uvicorn", "starlette")
if REASON is not None:
    pytest_pycollect_makemodule = skip_every_module(REASON)
