"""PrimeIntellect verifiers: a ``StatefulToolEnv`` with one episode per rollout.

``ToolservicesEnv`` is a verifiers ``StatefulToolEnv`` (the classic tool API,
``verifiers.StatefulToolEnv`` in 0.2 and 0.3; verifiers 0.4 dropped it) whose
tools are toolservices tools::

    env = ToolservicesEnv([python_tool(executor), add], dataset=dataset, rubric=rubric)

Per rollout, ``setup_state`` opens an :class:`~toolservices.Episode` (its
own Python session, started on first use), ``update_tool_args`` hands it to
each call, and a cleanup handler closes it when the rollout ends, however it
ends. Calls run through the episode: per-call timeout, argument validation,
and every failure as a tool message the model reads.

For tools served by ``toolservices serve --mcp`` (streamable HTTP), build the
tools with ``toolservices.mcp`` (``MCPToolset``) and pass them here, or give
verifiers' own (v1) harness the server as a toolset by URL: verifiers opens a
new MCP connection for every call and passes tool servers by URL only, so
run the server with ``--session-scope namespace`` and hand each rollout the
URL :func:`mcp_rollout_url` makes (token and a fresh namespace as URL
parameters); see ``docs/trainers.md``.
"""

from __future__ import annotations

import functools
import secrets
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

try:
    import verifiers as vf
    from verifiers.types import ToolMessage
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError(
        "toolservices.trainers.verifiers needs verifiers 0.2 or 0.3: "
        f"pip install 'toolservices[verifiers]' ({exc})"
    ) from exc

from toolservices.trainers._calls import adapter_spec, run_call

if TYPE_CHECKING:
    from toolservices.env import Episode
    from toolservices.python import PythonExecutorService
    from toolservices.tools import ToolRegistry

__all__ = ["EPISODE_KEY", "ToolservicesEnv", "mcp_rollout_url"]

#: Where the rollout's episode lives in the verifiers state (and the hidden tool argument).
EPISODE_KEY = "toolservices_episode"


class ToolservicesEnv(vf.StatefulToolEnv):
    """verifiers ``StatefulToolEnv`` running toolservices tools, one episode per rollout.

    * ``tools``: toolservices tools (``@tool`` functions, ``Tool`` objects,
      services, ``python_tool(executor)``).
    * ``python``: the executor whose sessions the episodes use (defaults to
      the executor of a ``python_tool`` among ``tools``).
    * ``timeout``: seconds per tool call (a tool's own limit wins).
    * other keyword arguments (``dataset``, ``rubric``, ``max_turns``,
      ``system_prompt``...) go to ``StatefulToolEnv``.
    """

    def __init__(
        self,
        tools: ToolRegistry | Iterable[Any],
        *,
        python: PythonExecutorService | None = None,
        timeout: float | None = 10.0,
        **kwargs: Any,
    ) -> None:
        self.spec = adapter_spec(tools, python=python, timeout=timeout, max_turns=None)
        super().__init__(tools=[], **kwargs)
        defs = []
        for tool in self.spec.registry:
            function = tool.openai_spec()["function"]
            defs.append(
                {
                    "name": function["name"],
                    "description": function["description"],
                    "parameters": function["parameters"],
                }
            )
            self.tool_map[tool.name] = functools.partial(self._call, tool.name)
            self.skipped_args[tool.name] = [EPISODE_KEY]
            self.tool_monitor_rubric.add_tool_metric(tool.name)
        self.tool_defs = self._normalize_tool_defs(defs)

    async def setup_state(self, state: vf.State) -> vf.State:
        """Open this rollout's episode (named after the rollout's trajectory id)."""
        state = await super().setup_state(state) or state
        state[EPISODE_KEY] = self.spec.new_episode(episode_id=f"vf-{state['trajectory_id']}")
        return state

    def update_tool_args(
        self,
        tool_name: str,
        tool_args: dict[str, Any],
        messages: vf.Messages,
        state: vf.State,
        **kwargs: Any,
    ) -> dict[str, Any]:
        """Hand the rollout's episode to the call (never shown to the model)."""
        return {**tool_args, EPISODE_KEY: state.get(EPISODE_KEY)}

    async def call_tool(
        self, tool_name: str, tool_args: dict[str, Any], tool_call_id: str, **kwargs: Any
    ) -> ToolMessage:
        """Run the call in the rollout's episode; failures come back as the message text.

        Every name goes through the episode, so an unknown tool gets the same
        readable error as any other failure.
        """
        text = await self._call(tool_name, **tool_args)
        return ToolMessage(role="tool", content=text, tool_call_id=tool_call_id)

    async def _call(self, tool_name: str, /, **tool_args: Any) -> str:
        episode: Episode | None = tool_args.pop(EPISODE_KEY, None)
        if episode is None:  # called outside a rollout: a throwaway episode
            async with self.spec.new_episode() as throwaway:
                return await run_call(throwaway, tool_name, tool_args)
        return await run_call(episode, tool_name, tool_args)

    @vf.cleanup
    async def close_episode(self, state: vf.State) -> None:
        """End the rollout's episode and its Python session."""
        episode = state.pop(EPISODE_KEY, None)
        if episode is not None:
            await episode.aclose()


def mcp_rollout_url(url: str, *, token: str, namespace: str | None = None) -> str:
    """``url`` of a ``serve --mcp --session-scope namespace`` server for one rollout.

    verifiers' harness programs reach a tool server by URL alone (no headers)
    and reconnect for every call, so the bearer token and the rollout's
    namespace ride as the ``access_token`` and ``namespace`` URL parameters:
    calls with this URL share Python sessions, calls with another
    namespace's URL cannot see them. ``namespace`` defaults to a fresh random
    one (letters, digits, ``.``, ``_``, ``:`` and ``-``, at most 128).
    """
    parts = urlsplit(url)
    query = [
        (key, value)
        for key, value in parse_qsl(parts.query, keep_blank_values=True)
        if key not in ("access_token", "namespace")
    ]
    query += [("access_token", token), ("namespace", namespace or f"vf-{secrets.token_hex(8)}")]
    return urlunsplit(parts._replace(query=urlencode(query)))
