"""What every episode of one driver gets, built and checked once.

``ToolEnv``, ``Rollout`` and the trainer adapters each start many
:class:`~toolservices.Episode` objects with the same tools, parser, limits,
executor and dispatcher. :class:`EpisodeSpec` holds those settings,
checks them with :func:`check_episode_options` when it is built (so a bad
setting fails at construction, not at the first rollout) and makes the
episodes.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from toolservices.dispatch import Dispatcher
from toolservices.env._hooks import EpisodeHook, check_hook
from toolservices.env.episode import (
    Episode,
    Prompt,
    ResultFormat,
    check_limits,
    on_dispatcher,
    resolve_python,
)
from toolservices.parsing import ParserLike, as_parser
from toolservices.tools import ToolRegistry

if TYPE_CHECKING:
    from toolservices.python import PythonExecutorService

__all__ = ["EpisodeSpec", "check_episode_options"]


def check_episode_options(
    registry: ToolRegistry,
    *,
    python: PythonExecutorService | None = None,
    max_turns: int | None = None,
    max_failed_turns: int | None = None,
    result_format: str = "openai",
) -> PythonExecutorService | None:
    """Raise :class:`~toolservices.UserError` for settings no episode could use.

    Checks the limits, the result format and the executor (``python=`` and
    the tools' ``python_tool`` executors must agree) without building an
    episode; returns the executor the episodes will use.
    """
    check_limits(max_turns, max_failed_turns, result_format)
    return resolve_python(registry, python)


class EpisodeSpec:
    """The settings shared by a driver's episodes; :meth:`new_episode` makes one.

    One registry (and so one set of tool objects), one parser and one
    :class:`~toolservices.Dispatcher` (one concurrency bound) serve every
    episode; only the conversation, ``state`` and Python session are per
    episode. ``dispatcher`` defaults to a new one with ``max_concurrency``,
    ``timeout`` and ``stop_on_error``; given, its settings are used.

    ``setup``, ``finalize`` and ``keep_sessions`` go to every episode (see
    :class:`~toolservices.Episode`, "Lifecycle").
    """

    def __init__(
        self,
        tools: ToolRegistry | Iterable[Any],
        *,
        parser: ParserLike = "hermes",
        system_prompt: str | None = None,
        max_turns: int | None = 8,
        max_failed_turns: int | None = None,
        result_format: ResultFormat = "openai",
        end_on_answer: bool = True,
        python: PythonExecutorService | None = None,
        dispatcher: Dispatcher | None = None,
        max_concurrency: int = 64,
        timeout: float | None = 10.0,
        stop_on_error: bool = False,
        setup: EpisodeHook | None = None,
        finalize: EpisodeHook | None = None,
        keep_sessions: bool = False,
    ) -> None:
        check_hook("setup", setup)
        check_hook("finalize", finalize)
        self.setup = setup
        self.finalize = finalize
        self.keep_sessions = keep_sessions
        self.registry = tools if isinstance(tools, ToolRegistry) else ToolRegistry(tools)
        self.python = check_episode_options(
            self.registry,
            python=python,
            max_turns=max_turns,
            max_failed_turns=max_failed_turns,
            result_format=result_format,
        )
        self.parser = as_parser(parser, tools=self.registry)
        self.system_prompt = system_prompt
        self.max_turns = max_turns
        self.max_failed_turns = max_failed_turns
        self.result_format: ResultFormat = result_format
        self.end_on_answer = end_on_answer
        self.dispatcher = (
            dispatcher
            if dispatcher is not None
            else Dispatcher(
                self.registry,
                max_concurrency=max_concurrency,
                timeout=timeout,
                stop_on_error=stop_on_error,
            )
        )

    @property
    def timeout(self) -> float | None:
        """Seconds per tool call (a tool's own limit wins)."""
        return self.dispatcher.timeout

    def new_episode(
        self,
        *,
        prompt: Prompt = None,
        episode_id: str | None = None,
        state: Mapping[str, Any] | None = None,
        context: Mapping[str, Any] | None = None,
    ) -> Episode:
        """A fresh episode: these settings, its own messages, state and (lazy) Python session."""
        return Episode(
            self.registry,
            parser=self.parser,
            prompt=prompt,
            system_prompt=self.system_prompt,
            max_turns=self.max_turns,
            max_failed_turns=self.max_failed_turns,
            result_format=self.result_format,
            end_on_answer=self.end_on_answer,
            python=self.python,
            episode_id=episode_id,
            state=state,
            context=context,
            setup=self.setup,
            finalize=self.finalize,
            keep_sessions=self.keep_sessions,
            **on_dispatcher(self.dispatcher),
        )
