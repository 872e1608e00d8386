"""``PythonInterpreter``: run the model's ```` ```python ```` blocks, per item, in order.

Every block becomes a call of an internal ``python`` tool that the core
dispatcher runs: items concurrently, blocks of one item in order. Where the
code runs:

* ``services=None, persistent=False``: a fresh interpreter per block, forked
  from a private :class:`PythonExecutorService` (milliseconds, no temp files);
* ``services=None, persistent=True``: one :class:`PersistentPythonProcess`
  per batch item (``processes[i]``), a session of that private executor;
* ``services="local"`` or ``"ray"``: the executor registered under
  ``service_name``, through a session keyed by this environment and the batch
  index, so each item keeps its variables between turns (TorchRL sends
  consecutive calls of an item to different interpreters).

Resetting an item (a full reset or a ``_reset`` mask) ends only that item's
interpreter or session. ``close()`` ends them all, and a ``weakref.finalize``
does the same if the environment is garbage collected without it.
"""

from __future__ import annotations

import logging
import weakref
from collections.abc import Sequence
from typing import Any

import anyio

from toolservices._portal import run_sync
from toolservices.dispatch import ItemResult
from toolservices.env import exec_result_text
from toolservices.errors import InfrastructureError, UserError
from toolservices.python import ExecResult, PersistentPythonProcess, PythonExecutorService
from toolservices.tools import Tool, ToolRegistry
from toolservices.torchrl._base import METRICS_KEY
from toolservices.torchrl._history import ToolMessage
from toolservices.torchrl.execute import DispatchingTransform

__all__ = ["PythonInterpreter"]

log = logging.getLogger(__name__)

#: Extra seconds the dispatcher waits beyond the executor's own time limit, so
#: that the executor (which kills the process tree) reports the timeout.
_TIMEOUT_GRACE = 5.0
_BACKENDS = ("local", "ray")


class PythonInterpreter(DispatchingTransform):
    """Execute the Python code blocks of each item's last assistant message.

    Arguments as in TorchRL. ``persistent=None`` (the default) means fresh
    interpreters locally and per-item sessions with a service; pass a bool to
    choose. Keyword-only extras: ``pool_size`` of the private executor,
    ``max_concurrency``, ``max_failed_turns``, ``metrics_key``.
    """

    def __init__(
        self,
        tokenizer: Any = None,
        tool_name: str = "tool",
        persistent: bool | None = None,
        timeout: float = 10.0,
        services: str | None = None,
        service_name: str = "python_executor",
        namespace: str | None = None,
        *,
        pool_size: int = 32,
        max_concurrency: int = 64,
        max_failed_turns: int | None = None,
        metrics_key: str | None = METRICS_KEY,
        record_call_ids: bool = False,
    ) -> None:
        if services is not None and services not in _BACKENDS:
            raise UserError(
                f"Invalid services backend: {services!r}. Must be one of "
                f"{', '.join(map(repr, _BACKENDS))} or None"
            )
        self._runner = _Runner(timeout=timeout)
        registry = ToolRegistry([_PythonTool(self._runner, timeout + _TIMEOUT_GRACE)])
        from toolservices.parsing import get_parser

        super().__init__(
            registry=registry,
            parser=get_parser("python_block"),
            timeout=timeout + _TIMEOUT_GRACE,
            max_concurrency=max_concurrency,
            stop_on_error=False,
            pass_state=True,
            max_failed_turns=max_failed_turns,
            metrics_key=metrics_key,
            record_call_ids=record_call_ids,
        )
        self.tokenizer = tokenizer
        self.tool_role = tool_name
        self.timeout = timeout
        self.services = services
        self.service_name = service_name
        self.namespace = namespace
        self.pool_size = pool_size
        self.persistent = persistent if persistent is not None else services is not None
        self.python_service: Any = None
        self.processes: list[PersistentPythonProcess] | None = None
        runner = self._runner
        runner.env_key = self.env_key
        runner.persistent = self.persistent
        if services is None:
            runner.executor = PythonExecutorService(pool_size=pool_size, timeout=timeout)
            self.processes = runner.processes
        else:
            runner.client, self.python_service = _service_client(services, service_name, namespace)
        self._finalizer = weakref.finalize(self, runner.close)
        self._finalizer.atexit = False  # at exit the executor's own safety net runs

    # -- contract surface -------------------------------------------------------------

    def clone(self) -> PythonInterpreter:
        """A new transform with the same settings (its own interpreters/sessions)."""
        return type(self)(
            tokenizer=self.tokenizer,
            tool_name=self.tool_role,
            persistent=self.persistent,
            timeout=self.timeout,
            services=self.services,
            service_name=self.service_name,
            namespace=self.namespace,
            pool_size=self.pool_size,
            max_failed_turns=self.max_failed_turns,
            metrics_key=self.metrics_key,
            record_call_ids=self.record_call_ids,
        )

    def close(self) -> None:
        """End this transform's interpreters (local) or sessions (service)."""
        self._finalizer()

    def _execute_python_code(self, code: str, i: int) -> ExecResult:
        """Run ``code`` for batch item ``i`` (TorchRL's method); never raises."""
        return run_sync(self._runner.execute_safely, code, i)

    # -- hooks ------------------------------------------------------------------------------

    def _messages(self, outcome: ItemResult) -> list[ToolMessage]:
        messages = []
        for result in outcome.results:
            number = result.index + 1
            if result.ok:
                text = f"Code block {number} executed successfully:\n{result.value}"
            else:
                text = f"Code block {number} failed:\n{result.error or ''}"
            messages.append(ToolMessage(text))
        return messages

    def _end_sessions(self, indices: Sequence[int]) -> None:
        self._runner.end(indices)


class _Runner:
    """Where the code of item ``i`` runs; holds no reference to the transform."""

    def __init__(self, *, timeout: float) -> None:
        self.timeout = timeout
        self.env_key = ""
        self.persistent = False
        self.executor: PythonExecutorService | None = None
        self.client: Any = None
        self.processes: list[PersistentPythonProcess] = []
        self.used: set[int] = set()
        self.closed = False

    def session_id(self, i: int) -> str:
        return f"{self.env_key}:{i}"

    def _process(self, i: int) -> PersistentPythonProcess:
        while len(self.processes) <= i:
            self.processes.append(PersistentPythonProcess(self.timeout, service=self.executor))
        return self.processes[i]

    async def execute(self, code: str, i: int) -> ExecResult:
        if self.closed:
            raise InfrastructureError("this PythonInterpreter was closed", retryable=False)
        if self.client is not None:
            kwargs: dict[str, Any] = {"timeout": self.timeout}
            if self.persistent:
                kwargs["session_id"] = self.session_id(i)
                self.used.add(i)
            result: ExecResult = await self.client.acall("execute", code, **kwargs)
            return result
        if self.persistent:
            self.used.add(i)
            return await self._process(i).aexecute(code)
        assert self.executor is not None
        return await self.executor.aexecute(code, timeout=self.timeout)

    async def execute_safely(self, code: str, i: int) -> ExecResult:
        try:
            return await self.execute(code, i)
        except InfrastructureError as exc:
            return ExecResult(success=False, stdout="", stderr=exc.message, returncode=-1)

    def end(self, indices: Sequence[int]) -> None:
        """End the interpreters/sessions of these items (they restart on next use)."""
        ending = [i for i in indices if i in self.used]
        if not ending:
            return
        self.used.difference_update(ending)
        if self.client is None:
            for i in ending:
                if i < len(self.processes):
                    self.processes[i].cleanup()
                    self.processes[i] = PersistentPythonProcess(self.timeout, service=self.executor)
            return
        run_sync(self._aclose_sessions, ending)

    async def _aclose_sessions(self, indices: Sequence[int]) -> None:
        async def close_one(i: int) -> None:
            sid = self.session_id(i)
            try:
                await self.client.acall("close_session", session_id=sid)
            except InfrastructureError as exc:  # the session is gone with its service
                log.warning("could not close Python session %s: %s", sid, exc.message)

        async with anyio.create_task_group() as tg:
            for i in indices:
                tg.start_soon(close_one, i)

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        if self.client is not None:
            self.end(sorted(self.used))
            return
        for process in self.processes:
            process.cleanup()
        self.processes.clear()
        if self.executor is not None:
            self.executor.close()


class _PythonTool(Tool):
    """The ``python`` tool the dispatcher runs for each code block."""

    name = "python"
    description = "Run Python code; its printed output is returned."
    schema_in = {
        "type": "object",
        "properties": {"code": {"type": "string"}},
        "required": ["code"],
    }
    schema_out: dict[str, Any] = {}
    accepts_state = True
    is_async = True

    def __init__(self, runner: _Runner, timeout: float) -> None:
        self.runner = runner
        self.timeout = timeout

    def __call__(self, **kwargs: Any) -> Any:
        raise TypeError("the python tool is async: use 'await tool.acall(...)'")

    async def acall(self, **kwargs: Any) -> Any:
        state = kwargs.get("_state") or {}
        result = await self.runner.execute(kwargs["code"], int(state.get("batch_index", 0)))
        # TorchRL's success text is stdout alone
        return exec_result_text(result, with_stderr=False)


def _service_client(backend: str, name: str, namespace: str | None) -> tuple[Any, Any]:
    """A client of the registered executor, and what ``registry.get`` returns for it."""
    from toolservices.services import get_services

    kwargs = {"namespace": namespace} if namespace is not None else {}
    registry = get_services(backend, **kwargs)
    if name not in registry:
        raise RuntimeError(
            f"Failed to get Ray service '{name}' ({backend} backend, namespace "
            f"{registry.namespace!r}): it is not registered. Register it first, e.g. "
            f"get_services({backend!r}).register({name!r}, PythonExecutorService, pool_size=32)"
        )
    return registry.client(name), registry.get(name)
