"""Run tool calls that a trainer has already parsed inside a toolservices Episode.

Trainers (TRL, verifiers, verl) parse the model's tool calls themselves and
hand over one call at a time as a name and arguments. Each adapter keeps one
:class:`~toolservices.Episode` per rollout; this module turns such a call into
an assistant turn for that episode, so the episode's timeout, ``_state``
(with its own Python session), argument validation and error rendering apply
exactly as for text the library parsed itself.
"""

from __future__ import annotations

import asyncio
import json
import uuid
import weakref
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from toolservices.env import Episode
from toolservices.errors import UserError
from toolservices.tools import ToolRegistry

if TYPE_CHECKING:
    from toolservices.python import PythonExecutorService

__all__ = ["EpisodeSpec", "run_call"]


class EpisodeSpec:
    """What every episode of one adapter gets: tools, executor, time limit.

    One registry (and so one set of tool objects) serves all episodes; only
    the episode, its ``state`` and its Python session are per rollout.
    """

    def __init__(
        self,
        tools: ToolRegistry | Iterable[Any],
        *,
        python: PythonExecutorService | None = None,
        timeout: float | None = 10.0,
        max_turns: int | None = None,
    ) -> None:
        if timeout is not None and timeout <= 0:
            raise UserError(f"timeout must be positive or None, got {timeout}")
        self.registry = tools if isinstance(tools, ToolRegistry) else ToolRegistry(tools)
        if not len(self.registry):
            raise UserError("an adapter needs at least one tool")
        self.python = python
        self.timeout = timeout
        self.max_turns = max_turns
        # Fails here, not at the first rollout, for two executors and the like; the
        # probe never ran a call, so closing it only detaches its session safety net.
        self.new_episode()._mark_closed()

    def new_episode(
        self, *, episode_id: str | None = None, state: Mapping[str, Any] | None = None
    ) -> Episode:
        """A fresh episode: no messages, its own (lazily started) Python session."""
        return Episode(
            self.registry,
            parser=None,  # the trainer parsed the call: the episode runs tool_calls only
            python=self.python,
            timeout=self.timeout,
            max_turns=self.max_turns,
            end_on_answer=False,
            episode_id=episode_id,
            state=state,
        )


#: One lock per episode: a trainer may run one turn's calls concurrently (verl gathers
#: them), but an episode steps one call at a time, in the order the calls arrive.
_LOCKS: weakref.WeakKeyDictionary[Episode, asyncio.Lock] = weakref.WeakKeyDictionary()


async def run_call(episode: Episode, name: str, arguments: Mapping[str, Any] | str) -> str:
    """Run one parsed call in ``episode`` and return the text the model reads.

    ``arguments`` is a mapping or the JSON text the model wrote. Nothing the
    model or a tool does raises: bad JSON, an unknown tool, invalid arguments,
    a failure or a timeout come back as the error text. A call on an episode
    that has ended (``max_turns``, closed) says so in the text as well.
    """
    text = arguments if isinstance(arguments, str) else json.dumps(dict(arguments), default=str)
    message = {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {
                "id": f"call_{uuid.uuid4().hex[:12]}",
                "type": "function",
                "function": {"name": name, "arguments": text},
            }
        ],
    }
    lock = _LOCKS.get(episode)
    if lock is None:
        lock = _LOCKS.setdefault(episode, asyncio.Lock())
    async with lock:
        if episode.done:
            return f"Error: the episode has ended ({episode.reason}); tool '{name}' was not run."
        replies = await episode.step(message)
    return "\n".join(str(reply.get("content", "")) for reply in replies)
