"""verl (0.9): a ``BaseTool`` for YAML tool configs and an agent loop that keeps sessions.

verl's ``ToolAgentLoop`` calls ``create``, ``execute`` and ``release`` around
*every* tool call, so a ``BaseTool`` that kept state per instance id would
forget it between two calls of one trajectory. :class:`ToolservicesAgentLoop`
(registered as ``"toolservices_agent"``) marks the trajectory it runs; inside
it, :class:`ToolservicesTool` keeps one :class:`~toolservices.Episode` per
trajectory, keyed by the loop's request id, and the loop closes them (and
their Python sessions) when the trajectory ends, however it ends. Under
another agent loop the tool falls back to one episode per instance id,
closed on ``release`` (verl's own semantics: no state between calls).

YAML (``actor_rollout_ref.rollout.multi_turn.tool_config_path``)::

    tools:
      - class_name: toolservices.trainers.verl.ToolservicesTool
        config:
          type: native
          tool: python                 # or "package.module:attribute" of a tool
          timeout: 10                  # seconds per call
          executor: {pool_size: 8, timeout: 10}   # for the python tool
        tool_schema: null              # taken from the toolservices tool

and select the loop with ``agent_name: toolservices_agent`` in the data (or
``actor_rollout_ref.rollout.agent.default_agent_loop``).

Shell tools: ``tool: bash`` (or ``read_file``, ``write_file``, ``str_replace``), with
``shell: {pool_size: 8, timeout: 30}`` (keyword arguments of ``ShellService``). The
shell tools of one worker with the same ``shell`` config share one service and, in a
trajectory of the agent loop, one shell session (one episode), so a file written with
``write_file`` is there for ``bash``.
"""

from __future__ import annotations

import contextvars
import importlib
import uuid
from typing import Any

try:
    from verl.experimental.agent_loop.agent_loop import register
    from verl.experimental.agent_loop.tool_agent_loop import ToolAgentLoop
    from verl.tools.base_tool import BaseTool
    from verl.tools.schemas import OpenAIFunctionToolSchema, ToolResponse
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError(
        f"toolservices.trainers.verl needs verl 0.9: pip install 'toolservices[verl]' ({exc})"
    ) from exc

from toolservices.env import Episode, python_tool, shell_tools
from toolservices.env.episode import aclose_all
from toolservices.errors import UserError
from toolservices.python import PythonExecutorService
from toolservices.tools import Tool, as_tool
from toolservices.trainers._calls import adapter_spec, load_hook, run_call
from toolservices.trainers._executors import SHARED_EXECUTORS

__all__ = [
    "ToolservicesAgentLoop",
    "ToolservicesTool",
    "close_shared_executors",
    "shared_executor",
    "shared_shell",
]

_SHELL_TOOLS = ("bash", "read_file", "write_file", "str_replace")


def shared_executor(**config: Any) -> PythonExecutorService:
    """The process's executor for ``config`` (one per distinct configuration).

    verl builds tools from YAML in every rollout worker; the python tools of
    one worker share one executor (and so one fork server), owned by
    :data:`~toolservices.trainers._executors.SHARED_EXECUTORS`.
    """
    return SHARED_EXECUTORS.get(**config)


def close_shared_executors() -> None:
    """Close the executors and shell services the tools of this process share (after training)."""
    SHARED_EXECUTORS.close()


def shared_shell(**config: Any) -> Any:
    """The process's ``ShellService`` for ``config`` (one per distinct configuration),
    owned by :data:`~toolservices.trainers._executors.SHARED_EXECUTORS` like the executors."""
    return SHARED_EXECUTORS.shell(**config)


class _Trajectory:
    """The episodes one agent-loop run opened, keyed by (tool name, request id)."""

    def __init__(self) -> None:
        self.episodes: dict[tuple[str, ...], Episode] = {}

    async def aclose(self) -> None:
        episodes, self.episodes = list(self.episodes.values()), {}
        await aclose_all(episodes)  # one failed release does not keep the others open


_TRAJECTORY: contextvars.ContextVar[_Trajectory | None] = contextvars.ContextVar(
    "toolservices_verl_trajectory", default=None
)


def _load_tool(config: dict[str, Any]) -> tuple[Tool, PythonExecutorService | None]:
    ref = config.get("tool")
    valid = (
        "'python', 'bash', 'read_file', 'write_file', 'str_replace' or 'package.module:attribute'"
    )
    if not isinstance(ref, str) or not ref:
        raise UserError(f"ToolservicesTool config needs 'tool': {valid}")
    if ref == "python":
        executor = shared_executor(**dict(config.get("executor") or {}))
        return python_tool(executor, name=config.get("name") or "python"), executor
    module_name, _, attribute = ref.partition(":")
    if not attribute:
        raise UserError(f"tool {ref!r}: expected {valid}")
    obj: Any = importlib.import_module(module_name)
    for part in attribute.split("."):
        obj = getattr(obj, part)
    return as_tool(obj), None


def verl_schema(tool: Tool) -> OpenAIFunctionToolSchema:
    """verl's schema model for ``tool`` (it keeps type, description and enum per argument)."""
    schema = tool.schema_in or {}
    properties = {}
    for name, prop in (schema.get("properties") or {}).items():
        prop = prop if isinstance(prop, dict) else {}
        entry: dict[str, Any] = {"type": _json_types(prop)}
        if prop.get("description"):
            entry["description"] = prop["description"]
        if isinstance(prop.get("enum"), list):
            entry["enum"] = prop["enum"]
        properties[name] = entry
    return OpenAIFunctionToolSchema.model_validate(
        {
            "type": "function",
            "function": {
                "name": tool.name,
                "description": tool.description,
                "parameters": {
                    "type": "object",
                    "properties": properties,
                    "required": list(schema.get("required") or []),
                },
            },
        }
    )


def _json_types(prop: dict[str, Any]) -> str | list[str]:
    kind = prop.get("type")
    if isinstance(kind, str):
        return kind
    found: list[str] = []
    options = kind if isinstance(kind, list) else prop.get("anyOf") or prop.get("oneOf") or []
    for option in options:
        sub = (
            option
            if isinstance(option, str)
            else _json_types(option)
            if isinstance(option, dict)
            else None
        )
        for name in [sub] if isinstance(sub, str) else sub or []:
            if name not in found:
                found.append(name)
    if not found:
        return "string" if "enum" in prop else "object"
    return found[0] if len(found) == 1 else found


class ToolservicesTool(BaseTool):
    """A verl ``BaseTool`` running one toolservices tool with per-trajectory episodes.

    ``config`` (the YAML ``config:`` block): ``tool`` ("python", a shell tool
    name or an import path), ``timeout`` (seconds per call, default 10),
    ``executor`` (keyword arguments of :class:`~toolservices.PythonExecutorService`
    for the python tool), ``shell`` (keyword arguments of ``ShellService`` for
    the shell tools), ``name`` (rename the python tool), ``setup`` and
    ``finalize`` (``"package.module:function"``: episode hooks, see
    :class:`~toolservices.Episode`; the episode's ``state`` is the
    ``create_kwargs`` verl passes to ``create``). With ``finalize``,
    ``calc_reward`` runs it on the instance's episode and returns its value.
    """

    def __init__(
        self, config: dict[str, Any], tool_schema: OpenAIFunctionToolSchema | None
    ) -> None:
        timeout = config.get("timeout", 10.0)
        setup = load_hook("setup", config.get("setup"))
        finalize = load_hook("finalize", config.get("finalize"))
        self.tool: Tool
        self._shell_key: str | None = None
        if config.get("tool") in _SHELL_TOOLS:
            # all four in the episode: the worker's shell tools share it per trajectory
            shell = shared_shell(**dict(config.get("shell") or {}))
            tools = shell_tools(shell)
            self.tool = next(t for t in tools if t.name == config["tool"])
            self._shell_key = f"shell-{id(shell)}"
            self.spec = adapter_spec(
                tools, timeout=timeout, max_turns=None, setup=setup, finalize=finalize
            )
        else:
            self.tool, executor = _load_tool(config)
            self.spec = adapter_spec(
                [self.tool],
                python=executor,
                timeout=timeout,
                max_turns=None,
                setup=setup,
                finalize=finalize,
            )
        self._instances: dict[str, Episode] = {}
        self._states: dict[str, dict[str, Any]] = {}
        super().__init__(config, tool_schema or verl_schema(self.tool))

    async def create(
        self, instance_id: str | None = None, **kwargs: Any
    ) -> tuple[str, ToolResponse]:
        instance_id = instance_id or uuid.uuid4().hex
        state = kwargs.get("create_kwargs")
        if isinstance(state, dict):
            self._states[instance_id] = dict(state)
        return instance_id, ToolResponse()

    async def execute(
        self, instance_id: str, parameters: dict[str, Any], **kwargs: Any
    ) -> tuple[ToolResponse, float, dict[str, Any]]:
        episode = self._episode(instance_id, kwargs.get("agent_data"))
        text = await run_call(episode, self.name, parameters)
        last = episode.last
        failed = bool(last and last.metrics.failed_calls)
        timed_out = bool(last and last.metrics.timeouts)
        return ToolResponse(text=text), 0.0, {"failed": failed, "timed_out": timed_out}

    async def calc_reward(self, instance_id: str, **kwargs: Any) -> float:
        """``finalize``'s value on the instance's episode (0.0 without one, or when it failed)."""
        episode = self._instances.get(instance_id)
        if episode is None or self.spec.finalize is None:
            return 0.0
        outcome = await episode.afinalize()
        return float(outcome) if outcome is not None else 0.0

    async def release(self, instance_id: str, **kwargs: Any) -> None:
        self._states.pop(instance_id, None)
        episode = self._instances.pop(instance_id, None)
        if episode is not None:
            await episode.aclose()

    def _episode(self, instance_id: str, agent_data: Any) -> Episode:
        trajectory = _TRAJECTORY.get()
        request_id = getattr(agent_data, "request_id", None)
        if trajectory is not None and request_id is not None:
            owner = self._shell_key or self.name
            key = (owner, str(request_id))
            episode = trajectory.episodes.get(key)
            if episode is None:
                episode = trajectory.episodes[key] = self.spec.new_episode(
                    episode_id=f"{request_id}-{owner}-{uuid.uuid4().hex[:6]}",
                    state=self._states.get(instance_id),
                )
            return episode
        episode = self._instances.get(instance_id)
        if episode is None:
            episode = self._instances[instance_id] = self.spec.new_episode(
                state=self._states.get(instance_id)
            )
        return episode


@register("toolservices_agent")
class ToolservicesAgentLoop(ToolAgentLoop):
    """verl's ``ToolAgentLoop`` with one toolservices episode per tool and trajectory.

    The episodes (and Python sessions) opened while :meth:`run` works on a
    trajectory are closed when it returns, raises or is cancelled.
    """

    async def run(self, sampling_params: dict[str, Any], **kwargs: Any) -> Any:
        trajectory = _Trajectory()
        token = _TRAJECTORY.set(trajectory)
        try:
            return await super().run(sampling_params, **kwargs)
        finally:
            _TRAJECTORY.reset(token)
            await trajectory.aclose()
