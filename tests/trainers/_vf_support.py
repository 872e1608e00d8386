"""Helpers for the verifiers 0.4 tests, importable by the tool servers verifiers starts.

verifiers starts a task-scoped toolset as ``python -m <module of its class>``,
so the test's toolset subclass lives in this module (the test puts its
directory on ``PYTHONPATH``) and ends with the ``run()`` hook.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import psutil
import verifiers.v1 as vf
from verifiers.v1.harnesses.null.harness import NullHarness

from toolservices.trainers.verifiers import ToolservicesToolset

#: Where :class:`LoggedToolset` appends its lifecycle events (one JSON object a line).
LOG_ENV = "TOOLSERVICES_VF_TEST_LOG"


class LocalNullHarness(NullHarness):
    """verifiers' null harness (its own bundled chat program), run by this interpreter.

    The stock harness installs the program's dependencies with ``uv`` from
    the network first; the tests' venv already has them (openai, mcp 2).
    """

    async def setup(self, runtime: Any) -> None:
        return None

    async def launch(self, ctx: Any, trace: Any, runtime: Any, *args: Any, **kwargs: Any) -> Any:
        async def local_program(
            source: str | bytes, env: Any = None, *, activate: bool = True
        ) -> list[str]:
            path = f"chat-{trace.id}.py"
            await runtime.write(path, source.encode() if isinstance(source, str) else source)
            return [sys.executable, str(Path(runtime.workdir) / path)]

        runtime.prepare_uv_script = local_program  # this rollout's runtime only
        return await super().launch(ctx, trace, runtime, *args, **kwargs)


class SeededData(vf.TaskData):
    """Task data with where the counter starts (``_hooks.seed`` reads it from the episode's
    state); here so that the tool server, which loads the task by class path, can import it."""

    start: int = 0


def _log(event: str, **data: Any) -> None:
    path = os.environ.get(LOG_ENV)
    if path:
        with open(path, "a") as f:
            f.write(json.dumps({"event": event, "server": os.getpid(), **data}) + "\n")


class LoggedToolset(ToolservicesToolset):
    """The library's toolset, saying when it starts, which processes serve its
    calls (the server's descendants) and when its exit stack has run."""

    async def setup(self) -> None:
        self._exit_stack.callback(_log, "closed")  # pushed first: runs after everything
        await super().setup()
        _log("setup")

    async def _call(self, name: str, args: dict[str, Any]) -> str:
        text = await super()._call(name, args)
        children = psutil.Process().children(recursive=True)
        _log("call", tool=name, pids=[[p.pid, p.create_time()] for p in children])
        return text


if __name__ == "__main__":
    LoggedToolset.run()
