"""PrimeIntellect verifiers 0.4: a ``vf.Toolset`` whose tools run in toolservices sessions.

verifiers 0.4 is v1 only: tools are ``@vf.tool`` methods of a ``vf.Toolset``,
served over MCP to the harness program, and a task-scoped toolset (one that
``Task.toolsets`` returns) runs as its own server process for each rollout::

    import verifiers.v1 as vf
    from toolservices.trainers.verifiers import ToolservicesToolset, ToolservicesToolsetConfig

    class MyTask(vf.Task):
        @classmethod
        def toolsets(cls, config):
            return [ToolservicesToolset(ToolservicesToolsetConfig(tools=["python", "bash"]))]

:class:`ToolservicesToolset` offers ``python``, ``bash``, ``read_file``,
``write_file`` and ``str_replace`` (choose with ``tools=``). Each rollout
gets one :class:`~toolservices.Episode` (parser-free), so one Python
session and one shell session, started on first use; every call runs
through it (per-call time limit, argument validation, failures as text the
model reads). The episode, its sessions and the sandboxes behind them end
with the rollout's server, whatever way the rollout ends: verifiers stops
the server with SIGTERM, on which it shuts down and closes them. (The
server's SIGTERM handler makes that so: uvicorn re-raises the signal once
it has stopped serving, which would otherwise end the process before the
toolset's exit stack runs.)

Episode hooks (``setup``/``finalize`` in the config): setup runs with the
rollout's task data as the episode's state; finalize's value goes to the
rollout's ``trace.state`` (:class:`ToolservicesState`) through verifiers'
state channel before the task is scored, and :func:`finalize_reward` makes
it a reward.

Subclasses defined in your own module must end it with
``if __name__ == "__main__": MyToolset.run()``: verifiers starts a server
as ``python -m <the class's module>``.

The 0.2/0.3 ``StatefulToolEnv`` adapter (``ToolservicesEnv``) is gone with
verifiers 0.3: ``toolservices[verifiers]`` now installs verifiers 0.4.
:func:`mcp_rollout_url` still serves the other route, a shared
``toolservices serve --mcp --session-scope namespace`` reached by URL.
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import signal
import threading
import uuid
from collections.abc import Callable
from types import FrameType
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

try:
    import verifiers.v1 as vf
    from pydantic import field_validator
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError(
        "toolservices.trainers.verifiers needs verifiers 0.4: "
        f"pip install 'toolservices[verifiers]' ({exc})"
    ) from exc

from toolservices.errors import UserError
from toolservices.trainers._calls import adapter_spec, load_hook, outcome_score, run_call

if TYPE_CHECKING:
    from toolservices.env import Episode

__all__ = [
    "TOOLS",
    "ToolservicesState",
    "ToolservicesToolset",
    "ToolservicesToolsetConfig",
    "finalize_reward",
    "mcp_rollout_url",
]

_LOG = logging.getLogger(__name__)

_F = TypeVar("_F", bound=Callable[..., Any])
#: ``@vf.tool`` (marks a method as an MCP tool), typed where verifiers is not installed.
_vf_tool: Callable[[_F], _F] = vf.tool

#: The tools a :class:`ToolservicesToolset` can offer, in the order they are listed.
TOOLS = ("python", "bash", "read_file", "write_file", "str_replace")
_SHELL_TOOLS = frozenset(TOOLS[1:])


class ToolservicesToolsetConfig(vf.ToolsetConfig):
    """What every rollout's toolset gets.

    * ``tools``: which of :data:`TOOLS` to offer.
    * ``timeout``: seconds per call of ``python`` and ``bash`` (the sandbox
      kills the code's process tree and the model reads why).
    * ``setup``/``finalize``: ``"package.module:function"`` episode hooks (see
      :class:`~toolservices.Episode`): setup runs when the rollout's toolset
      starts, with the rollout's task data as the episode's ``state``;
      finalize when it ends, before its sessions close. Its value is the
      toolset's ``outcome`` and goes to the rollout's ``trace.state`` when
      the task declares :class:`ToolservicesState`, for
      :func:`finalize_reward`.
    * ``python_in_shell``: ``python`` runs in the rollout's shell session
      (``python_tool(shell=...)``): one environment for both, a file one
      writes the other sees (docs/episodes.md). Off: a session of its own.
    """

    tools: list[str] = list(TOOLS)
    timeout: float = 10.0
    python_in_shell: bool = False
    setup: str | None = None
    finalize: str | None = None

    @field_validator("tools")
    @classmethod
    def _known_tools(cls, tools: list[str]) -> list[str]:
        unknown = [name for name in tools if name not in TOOLS]
        if unknown or not tools:
            raise ValueError(
                f"unknown tools {unknown}; valid: {', '.join(TOOLS)}"
                if unknown
                else f"tools is empty; valid: {', '.join(TOOLS)}"
            )
        return tools

    @field_validator("timeout")
    @classmethod
    def _positive(cls, timeout: float) -> float:
        if not timeout > 0:
            raise ValueError(f"timeout must be positive, got {timeout}")
        return timeout


class ToolservicesToolset(vf.Toolset[ToolservicesToolsetConfig]):
    """Sandboxed Python and shell tools, one set of sessions per rollout.

    Task-scoped only (return it from ``Task.toolsets``): a taskset-scoped
    (shared) server would serve every rollout from one set of sessions, so
    its ``setup`` refuses. Tools keep their own names (no prefix).
    """

    TOOL_PREFIX: ClassVar[str | None] = None

    _episode: Episode | None = None

    async def setup(self) -> None:
        """Start the rollout's sandboxes and open its episode; both end with the server."""
        if not os.environ.get("VF_STATE_URL"):
            raise vf.ToolsetError(
                f"{type(self).__name__} runs one set of sessions per rollout: return it from "
                "Task.toolsets (task-scoped), not Taskset.toolsets (shared by all rollouts)"
            )
        names = list(self.config.tools)
        tools: list[Any] = []
        stack = self._exit_stack
        if threading.current_thread() is threading.main_thread():
            # uvicorn (which serves the toolset) shuts down on SIGTERM, restores the
            # handler it found and raises the signal again: with this handler that
            # unwinds through the exit stack instead of killing the process there.
            signal.signal(signal.SIGTERM, _unwind)
        in_shell = "python" in names and self.config.python_in_shell
        if "python" in names and not in_shell:
            from toolservices.env import python_tool
            from toolservices.python import PythonExecutorService

            # one session for the rollout's whole life: no spare interpreters forked ahead
            executor = PythonExecutorService(pool_size=1, timeout=self.config.timeout, spares=0)
            stack.push_async_callback(executor.aclose)
            tools.append(python_tool(executor))
        if _SHELL_TOOLS.intersection(names) or in_shell:
            from toolservices.env import python_tool, shell_tools
            from toolservices.shell import ShellService

            shell = ShellService(pool_size=1, timeout=self.config.timeout, spares=0)
            stack.push_async_callback(shell.aclose)
            if in_shell:
                tools.append(python_tool(shell=shell))
            tools += [t for t in shell_tools(shell) if t.name in names]
        spec = adapter_spec(
            tools,
            timeout=None,
            setup=load_hook("setup", self.config.setup),
            finalize=load_hook("finalize", self.config.finalize),
        )
        episode = spec.new_episode(episode_id=f"vf-{uuid.uuid4().hex[:12]}")
        stack.push_async_callback(_end, episode)  # first out: sessions before services
        self._episode = episode

    async def setup_task(self, task: Any) -> None:
        """Run the episode's ``setup`` with the rollout's task data as its ``state``.

        verifiers calls this once the server has fetched the rollout's task
        (right after :meth:`setup`); a failure ends the episode and the tools
        then say the environment could not be set up.
        """
        if self._episode is None:
            return
        dump = getattr(task, "model_dump", None)
        if callable(dump):
            self._episode.state.update(dump(mode="json"))
        await self._episode.astart()

    @property
    def outcome(self) -> Any:
        """What ``finalize`` returned (once the toolset ended), else None."""
        return None if self._episode is None else self._episode.outcome

    def register(self, mcp: Any) -> None:
        """Register the configured tools only."""
        super().register(_OnlyTools(mcp, set(self.config.tools)))

    async def _call(self, name: str, args: dict[str, Any]) -> str:
        if self._episode is None:
            raise vf.ToolsetError(f"{type(self).__name__} was not set up")
        return await run_call(self._episode, name, {k: v for k, v in args.items() if v is not None})

    @_vf_tool
    async def python(self, code: str) -> str:
        """Run Python code in a persistent interpreter: variables, imports and files are
        kept between calls. Returns what the code prints (use print() to see values)."""
        return await self._call("python", {"code": code})

    @_vf_tool
    async def bash(self, command: str) -> str:
        """Run one bash command in a persistent shell: the working directory, exported
        variables and files are kept between calls. Returns stdout, stderr and the exit
        status. stdin is closed: do not start interactive programs."""
        return await self._call("bash", {"command": command})

    @_vf_tool
    async def read_file(
        self, path: str, start_line: int | None = None, end_line: int | None = None
    ) -> str:
        """Show a text file with line numbers (or a directory's entries); give start_line
        and end_line (1-based, inclusive) for a range."""
        args = {"path": path, "start_line": start_line, "end_line": end_line}
        return await self._call("read_file", args)

    @_vf_tool
    async def write_file(self, path: str, content: str) -> str:
        """Create or overwrite a text file with the given content."""
        return await self._call("write_file", {"path": path, "content": content})

    @_vf_tool
    async def str_replace(self, path: str, old_str: str, new_str: str) -> str:
        """Replace old_str, which must occur exactly once in the file (same characters,
        whitespace and indentation), with new_str."""
        args = {"path": path, "old_str": old_str, "new_str": new_str}
        return await self._call("str_replace", args)


class ToolservicesState(vf.State):
    """A task's rollout state with room for the toolset's ``finalize`` result.

    Declare the task with it (``class MyTask(vf.Task[vf.TaskData,
    ToolservicesState])``): when the rollout's toolset ends, it writes
    finalize's value (JSON) and any hook error here, through verifiers' state
    channel, before the task is scored; :func:`finalize_reward` reads it.
    """

    toolservices_outcome: Any = None
    toolservices_error: str | None = None


async def finalize_reward(trace: Any) -> float:
    """finalize's value as a verifiers reward: plug it into a task's rewards
    (``TaskConfig(rewards={"tests": {"fn": "toolservices.trainers.verifiers:finalize_reward"}})``)
    or return it from an ``@vf.reward`` method.

    A number, or a mapping's numeric ``"score"``, is the reward; 0.0 when no
    value arrived (setup or finalize failed: ``trace.state.toolservices_error``
    says why). Any other value is refused: read ``trace.state.toolservices_outcome``
    in your own reward instead.
    """
    state = trace.state
    if not hasattr(state, _OUTCOME):
        raise UserError(
            f"the task's state ({type(state).__name__}) has no {_OUTCOME} field: declare the "
            "task as vf.Task[<its data>, ToolservicesState] (or a subclass of ToolservicesState)"
        )
    outcome = getattr(state, _OUTCOME)
    score = outcome_score(outcome)
    if score is not None:
        return score
    if outcome is None:
        return 0.0
    raise UserError(
        f"finalize returned a {type(outcome).__name__} without a numeric 'score': return a "
        f"number or {{'score': ...}}, or read trace.state.{_OUTCOME} in your own reward"
    )


_OUTCOME = "toolservices_outcome"
#: Seconds per request to verifiers' state channel: the server has 5 s after SIGTERM.
_STATE_TIMEOUT = 2.0


async def _end(episode: Episode) -> None:
    """The rollout's end: finalize, its value to the rollout's state, then the sessions."""
    try:
        await episode.afinalize()
        if episode.finalize is not None or episode.error is not None:
            await _report(episode)
    finally:
        await episode.aclose()


async def _report(episode: Episode) -> None:
    """Write finalize's value and the hooks' error into the rollout's ``trace.state``.

    verifiers replaces the whole state with what a server puts, so this reads
    the current state and changes only its two fields. Failures are logged
    (the server's log): the reward then reads no value.
    """
    import httpx

    url, secret = os.environ.get("VF_STATE_URL"), os.environ.get("VF_STATE_SECRET", "")
    if not url:
        return
    outcome, error = episode.outcome, episode.error
    try:
        json.dumps(outcome)
    except (TypeError, ValueError) as exc:
        problem = f"finalize returned a {type(outcome).__name__}, not JSON ({exc})"
        outcome, error = None, problem if error is None else f"{error}; {problem}"
    headers = {"Authorization": f"Bearer {secret}"}
    try:
        async with httpx.AsyncClient(timeout=_STATE_TIMEOUT, headers=headers) as client:
            got = await client.get(url)
            got.raise_for_status()
            state = got.json()
            if not isinstance(state, dict) or _OUTCOME not in state:
                _LOG.warning(
                    "finalize's value cannot reach the rollout: the task's state has no %s "
                    "field (declare the task with ToolservicesState)",
                    _OUTCOME,
                )
                return
            state.update({_OUTCOME: outcome, "toolservices_error": error})
            put = await client.put(
                url, content=json.dumps(state), headers={"Content-Type": "application/json"}
            )
            put.raise_for_status()
    except (httpx.HTTPError, ValueError) as exc:  # ValueError: a body that is not JSON
        _LOG.warning("finalize's value did not reach the rollout's state: %s", exc)


def _unwind(signum: int, frame: FrameType | None) -> None:
    """SIGTERM in a toolset server: exit through the exit stacks (once; a second is ignored)."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    raise SystemExit(128 + signum)


class _OnlyTools:
    """An MCP server as ``Toolset.register`` sees it, taking only the named tools."""

    def __init__(self, mcp: Any, names: set[str]) -> None:
        self._mcp = mcp
        self._names = names

    def add_tool(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        name = kwargs.get("name") or getattr(fn, "__name__", None)
        if name in self._names:
            return self._mcp.add_tool(fn, *args, **kwargs)
        return None

    def __getattr__(self, attribute: str) -> Any:
        return getattr(self._mcp, attribute)


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


# verifiers starts a task-scoped server as ``python -m <module of its class>``.
if __name__ == "__main__":  # pragma: no cover - run by verifiers in the rollout's runtime
    ToolservicesToolset.run()
