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
``write_file`` is there for ``bash``. ``tool: python`` with ``python_in_shell: true``
(and the same ``shell`` config) runs the code in that shell session too
(``python_tool(shell=...)``, docs/episodes.md): one environment for all of them.

Episode hooks: ``setup: "package.module:function"`` and ``finalize: ...`` in a
tool's config. Under ``toolservices_agent`` setup runs before the first turn
and finalize when the trajectory ends, and finalize's value is the
trajectory's ``reward_score`` (see :class:`ToolservicesAgentLoop`).
"""

from __future__ import annotations

import contextvars
import importlib
import uuid
from collections.abc import Iterable, Mapping
from typing import Any

import anyio

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
from toolservices.trainers._calls import adapter_spec, load_hook, outcome_score, run_call
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
    """The episodes one agent-loop run opened, one per tool group (a tool, or a worker's
    shell tools on one service)."""

    def __init__(self) -> None:
        self.episodes: dict[str, Episode] = {}
        self._names: dict[str, str] = {}  # group -> the name of the tool with its hooks

    async def start(self, tools: list[ToolservicesTool], tools_kwargs: Mapping[str, Any]) -> None:
        """Open the episodes of the tools with hooks and run their ``setup``, concurrently."""
        for tool in tools:
            kwargs = tools_kwargs.get(tool.name) or {}
            state = kwargs.get("create_kwargs") if isinstance(kwargs, Mapping) else None
            self._names[tool.group] = tool.name
            self.episodes[tool.group] = tool.new_episode(
                state=state if isinstance(state, Mapping) else None
            )
        async with anyio.create_task_group() as tg:
            for episode in self.episodes.values():
                tg.start_soon(episode.astart)  # never raises: a failure is episode.error

    async def score(self, output: Any) -> None:
        """Run ``finalize`` and hand its value to verl: ``output.reward_score`` and
        ``output.extra_fields["toolservices"]``."""
        scored = next((e for e in self.episodes.values() if e.finalize is not None), None)
        if scored is not None:
            await scored.afinalize()
        errors = {self._names.get(g, g): e.error for g, e in self.episodes.items() if e.error}
        if scored is None and not errors:
            return
        outcome = None if scored is None else scored.outcome
        output.extra_fields["toolservices"] = {"outcome": outcome, "errors": errors}
        if scored is None:
            return
        score = outcome_score(outcome)
        if score is None and scored.error is not None:
            score = 0.0  # setup or finalize failed: no reward to give, and verl needs one
        if score is not None:
            output.reward_score = score

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
    the shell tools), ``python_in_shell`` (the python tool runs in the
    trajectory's shell session), ``name`` (rename the python tool), ``setup`` and
    ``finalize`` (``"package.module:function"``: episode hooks, see
    :class:`~toolservices.Episode`; the episode's ``state`` is the
    ``create_kwargs`` verl passes to ``create``). Under
    :class:`ToolservicesAgentLoop` finalize's value becomes the trajectory's
    ``reward_score``; outside it, ``calc_reward`` runs it on the instance's
    episode and returns its value.
    """

    def __init__(
        self, config: dict[str, Any], tool_schema: OpenAIFunctionToolSchema | None
    ) -> None:
        timeout = config.get("timeout", 10.0)
        setup = load_hook("setup", config.get("setup"))
        finalize = load_hook("finalize", config.get("finalize"))
        self.tool: Tool
        #: The tools that share one episode per trajectory: a worker's shell tools on
        #: one service share theirs; any other tool has its own.
        self.group: str
        in_shell = config.get("tool") == "python" and bool(config.get("python_in_shell"))
        if in_shell and config.get("name") not in (None, "python"):
            raise UserError(
                "python_in_shell: the python tool keeps its name 'python' (the shell tools' "
                "episodes know it by that name)"
            )
        if config.get("tool") in _SHELL_TOOLS or in_shell:
            # all of them in the episode: the worker's shell tools (and a python tool with
            # python_in_shell) share it per trajectory, whichever of them makes it
            shell = shared_shell(**dict(config.get("shell") or {}))
            tools = [python_tool(shell=shell), *shell_tools(shell)]
            self.tool = next(t for t in tools if t.name == config["tool"])
            self.group = f"shell-{id(shell)}"
            self.spec = adapter_spec(
                tools, timeout=timeout, max_turns=None, setup=setup, finalize=finalize
            )
        else:
            self.tool, executor = _load_tool(config)
            self.group = self.tool.name
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
        """``finalize``'s value on the instance's episode, as verl's stock tools give a
        reward (0.0 without one, when it failed or is not a number: see
        :func:`~toolservices.trainers._calls.outcome_score`)."""
        episode = self._instances.get(instance_id)
        if episode is None or self.spec.finalize is None:
            return 0.0
        score = outcome_score(await episode.afinalize())
        return 0.0 if score is None else score

    async def release(self, instance_id: str, **kwargs: Any) -> None:
        self._states.pop(instance_id, None)
        episode = self._instances.pop(instance_id, None)
        if episode is not None:
            await episode.aclose()

    @property
    def has_hooks(self) -> bool:
        """Whether the config names a ``setup`` or ``finalize`` hook."""
        return self.spec.setup is not None or self.spec.finalize is not None

    def new_episode(self, *, state: Mapping[str, Any] | None, label: str = "verl") -> Episode:
        """A fresh episode of this tool's spec (its tools, hooks, time limit)."""
        return self.spec.new_episode(
            episode_id=f"{label}-{self.group}-{uuid.uuid4().hex[:6]}", state=state
        )

    def _episode(self, instance_id: str, agent_data: Any) -> Episode:
        trajectory = _TRAJECTORY.get()
        if trajectory is not None:
            episode = trajectory.episodes.get(self.group)
            if episode is None:
                label = str(getattr(agent_data, "request_id", None) or "verl")
                episode = trajectory.episodes[self.group] = self.new_episode(
                    state=self._states.get(instance_id), label=label
                )
            return episode
        episode = self._instances.get(instance_id)
        if episode is None:
            episode = self._instances[instance_id] = self.new_episode(
                state=self._states.get(instance_id)
            )
        return episode


def _hooked_tools(tools: Iterable[Any]) -> list[ToolservicesTool]:
    """The tool of each group whose config names hooks; at most one ``finalize`` in all.

    A group's episode takes its hooks from one tool: two tools of a group naming
    different hooks, or two groups with ``finalize`` (two rewards for one
    trajectory), are refused.
    """
    chosen: dict[str, ToolservicesTool] = {}
    for tool in tools:
        if not isinstance(tool, ToolservicesTool) or not tool.has_hooks:
            continue
        other = chosen.setdefault(tool.group, tool)
        hooks = (tool.spec.setup, tool.spec.finalize)
        if other is not tool and (other.spec.setup, other.spec.finalize) != hooks:
            raise UserError(
                f"tools {other.name!r} and {tool.name!r} share one shell session per "
                "trajectory but name different setup/finalize hooks: name them on one of them"
            )
    finalizing = [t.name for t in chosen.values() if t.spec.finalize is not None]
    if len(finalizing) > 1:
        raise UserError(
            f"tools {finalizing} each name a finalize hook: a trajectory has one reward, "
            "name finalize on one tool (or on one of the shell tools)"
        )
    return list(chosen.values())


@register("toolservices_agent")
class ToolservicesAgentLoop(ToolAgentLoop):
    """verl's ``ToolAgentLoop`` with one toolservices episode per tool and trajectory.

    Tools whose config names hooks get their episode before the first turn,
    and its ``setup`` runs then (its ``state``: the row's ``create_kwargs``
    for that tool); the others get theirs at their first call. When the
    trajectory ends, ``finalize`` runs and its value goes to verl: a number
    (or a mapping's numeric ``"score"``) is ``reward_score``, which verl uses
    instead of calling the reward function; 0.0 when setup or finalize failed;
    the value and the errors are in ``extra_fields["toolservices"]`` (which
    verl's reward functions read as ``extra_info["toolservices"]``). The
    episodes (and their sessions) are closed when :meth:`run` returns,
    raises or is cancelled.
    """

    def __init__(self, *args: Any, tools: Any = None, **kwargs: Any) -> None:
        # checked first: a refused configuration leaves nothing half-built
        self._hooked = _hooked_tools(getattr(tools, "tools", None) or [])
        super().__init__(*args, tools=tools, **kwargs)

    async def run(self, sampling_params: dict[str, Any], **kwargs: Any) -> Any:
        trajectory = _Trajectory()
        token = _TRAJECTORY.set(trajectory)
        try:
            await trajectory.start(self._hooked, kwargs.get("tools_kwargs") or {})
            output = await super().run(sampling_params, **kwargs)
            await trajectory.score(output)
            return output
        finally:
            _TRAJECTORY.reset(token)
            await trajectory.aclose()
