"""A framework-free multi-turn tool environment over OpenAI-format messages.

For trainers other than TorchRL: keep one conversation per batch item, feed
the policy's assistant responses in with :meth:`ToolEnv.step`, and get back
the tool messages to append, done flags with reasons, and metrics for reward
shaping. Nothing here imports torch.

Each batch item is an :class:`~toolservices.env.Episode`; this class only
steps them in lockstep (every active item each step) and collects the batch
view. Drivers that want items to progress independently use episodes directly.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import anyio

from toolservices._portal import run_sync
from toolservices.dispatch import Dispatcher, EpisodeMetrics, ItemResult, StepMetrics
from toolservices.env._hooks import EpisodeHook
from toolservices.env._spec import EpisodeSpec
from toolservices.env.episode import Episode, Message, ResultFormat, aclose_all, afinalize_all
from toolservices.errors import UserError
from toolservices.parsing import ParseResult, ParserLike
from toolservices.tools import ToolRegistry

if TYPE_CHECKING:
    from toolservices.python import PythonExecutorService

__all__ = ["EnvStep", "ToolEnv"]


@dataclass(kw_only=True)
class EnvStep:
    """What one :meth:`ToolEnv.step` produced, one entry per batch item."""

    #: Messages appended after the assistant turn (empty for finished items).
    tool_messages: list[list[Message]]
    done: list[bool]
    #: Why an item finished this step: ``answered``, ``max_turns`` or
    #: ``too_many_failures``; ``None`` while it goes on.
    reasons: list[str | None]
    metrics: list[StepMetrics]
    results: list[ItemResult] = field(default_factory=list)


class ToolEnv:
    """Batched multi-turn episodes in which a model calls tools.

    An item is done when its response makes no tool call (it answered), after
    ``max_turns`` assistant turns, or after ``max_failed_turns`` consecutive
    turns whose calls were all malformed or failing (when set). All items
    share one dispatcher, so ``max_concurrency`` bounds the whole batch.
    With ``python`` (or a ``python_tool`` among the tools) each item gets its
    own Python session, ended by the next :meth:`reset` or :meth:`close`.

    ``setup``/``finalize`` hooks (see :class:`~toolservices.Episode`) run per
    item: setup in :meth:`reset` (``states=`` seeds each item's ``state``),
    finalize in :meth:`finalize` or, at the latest, when the next
    :meth:`reset` or :meth:`close` ends the batch (:attr:`outcomes`,
    :attr:`errors`). ``max_turns=8`` suits short tool use; coding agents
    want 30 or more.
    """

    def __init__(
        self,
        tools: ToolRegistry | Iterable[Any],
        *,
        parser: ParserLike = "hermes",
        max_turns: int = 8,
        max_failed_turns: int | None = None,
        system_prompt: str | None = None,
        result_format: ResultFormat = "openai",
        max_concurrency: int = 64,
        timeout: float | None = 10.0,
        stop_on_error: bool = False,
        python: PythonExecutorService | None = None,
        setup: EpisodeHook | None = None,
        finalize: EpisodeHook | None = None,
        keep_sessions: bool = False,
    ) -> None:
        self.spec = EpisodeSpec(
            tools,
            parser=parser,
            system_prompt=system_prompt,
            max_turns=max_turns,
            max_failed_turns=max_failed_turns,
            result_format=result_format,
            python=python,
            max_concurrency=max_concurrency,
            timeout=timeout,
            stop_on_error=stop_on_error,
            setup=setup,
            finalize=finalize,
            keep_sessions=keep_sessions,
        )
        self.episodes: list[Episode] = []

    @property
    def registry(self) -> ToolRegistry:
        return self.spec.registry

    @property
    def parser(self) -> Callable[[Any], ParseResult]:
        return self.spec.parser

    @property
    def dispatcher(self) -> Dispatcher:
        """The dispatcher every item's calls run on (one ``max_concurrency`` bound)."""
        return self.spec.dispatcher

    # -- the batch view of the episodes -----------------------------------------------

    @property
    def tool_specs(self) -> list[dict[str, Any]]:
        """OpenAI-style specs to pass to the chat template as ``tools=``."""
        return self.registry.openai_specs()

    @property
    def batch_size(self) -> int:
        return len(self.episodes)

    @property
    def messages(self) -> list[list[Message]]:
        """Each item's conversation (the episodes' own lists)."""
        return [e.messages for e in self.episodes]

    @property
    def done(self) -> list[bool]:
        return [e.done for e in self.episodes]

    @property
    def reasons(self) -> list[str | None]:
        return [e.reason for e in self.episodes]

    @property
    def metrics(self) -> list[EpisodeMetrics]:
        return [e.metrics for e in self.episodes]

    # -- episodes ------------------------------------------------------------------------

    def reset(
        self,
        prompts: Sequence[str | Sequence[Mapping[str, Any]]],
        *,
        states: Sequence[Mapping[str, Any]] | None = None,
    ) -> list[list[Message]]:
        """Synchronous :meth:`areset`."""
        if self.spec.setup is None and not self._to_release():
            self._new_batch(prompts, states)  # nothing to wait for: no trip to the loop
            return self.messages
        return run_sync(functools.partial(self.areset, prompts, states=states))

    async def areset(
        self,
        prompts: Sequence[str | Sequence[Mapping[str, Any]]],
        *,
        states: Sequence[Mapping[str, Any]] | None = None,
    ) -> list[list[Message]]:
        """End the current episodes, start one per prompt (a user string or a message list).

        ``states[i]`` seeds episode i's ``state``. With a ``setup`` hook, it
        runs for every episode (concurrently) before this returns; an
        episode whose setup failed is done (``reasons``, ``errors``).
        """
        await self.aclose()
        self._new_batch(prompts, states)
        async with anyio.create_task_group() as tg:
            for episode in self.episodes:
                tg.start_soon(episode.astart)
        return self.messages

    def _new_batch(
        self,
        prompts: Sequence[str | Sequence[Mapping[str, Any]]],
        states: Sequence[Mapping[str, Any]] | None,
    ) -> None:
        if states is not None and len(states) != len(prompts):
            raise UserError(f"got {len(states)} states for {len(prompts)} prompts")
        for episode in self.episodes:
            episode._mark_closed()
        self.episodes = [
            self.spec.new_episode(
                prompt=prompt,
                state=states[i] if states is not None else None,
                context={"batch_index": i},
            )
            for i, prompt in enumerate(prompts)
        ]
        if self.spec.setup is None:
            for episode in self.episodes:
                episode._started = True  # nothing to run before the first turn

    @property
    def outcomes(self) -> list[Any]:
        """What each episode's ``finalize`` returned (after :meth:`finalize` or :meth:`close`)."""
        return [e.outcome for e in self.episodes]

    @property
    def errors(self) -> list[str | None]:
        """Each episode's ``setup``/``finalize`` failure, if any."""
        return [e.error for e in self.episodes]

    def finalize(self) -> list[Any]:
        """Synchronous :meth:`afinalize`."""
        return run_sync(self.afinalize)

    async def afinalize(self) -> list[Any]:
        """Run every episode's ``finalize`` now (sessions stay open); the outcomes."""
        await afinalize_all(self.episodes)
        return self.outcomes

    def step(self, responses: Sequence[str | Mapping[str, Any] | None]) -> EnvStep:
        """Synchronous :meth:`astep`."""
        return run_sync(functools.partial(self.astep, responses))

    async def astep(self, responses: Sequence[str | Mapping[str, Any] | None]) -> EnvStep:
        """Append each assistant response, run its calls, append the results.

        ``responses[i]`` is ignored (use ``None``) for items already done.
        """
        if len(responses) != self.batch_size:
            raise UserError(
                f"step() got {len(responses)} response(s) for a batch of {self.batch_size}; "
                "call reset() first"
            )
        n = self.batch_size
        step = EnvStep(
            tool_messages=[[] for _ in range(n)],
            done=self.done,
            reasons=[None] * n,
            metrics=[StepMetrics() for _ in range(n)],
            results=[ItemResult() for _ in range(n)],
        )
        active = [i for i in range(n) if not self.episodes[i].done]
        if not active:
            return step
        # Three phases over the batch (parse all, one dispatch, record all) rather
        # than one task per episode.astep: the same work, and the same Episode code
        # for ids, _state, metrics and rendering, at about 15 us less per item
        # (docs/benchmarks.md). Parsing first also means a bad response raises
        # before any call of the batch ran.
        episodes = [self.episodes[i] for i in active]
        begun = [self.episodes[i]._begin_turn(_response(responses[i])) for i in active]
        for episode in episodes:
            episode._busy = True
        try:
            outcomes = await self.dispatcher.arun(
                [parsed for parsed, _ in begun],
                states=[state for _, state in begun],
            )
        finally:
            for episode in episodes:
                episode._busy = False
        for episode, i, outcome in zip(episodes, active, outcomes, strict=True):
            episode.record_turn(outcome)
            step.tool_messages[i] = episode._append_turn(_response(responses[i]), outcome)
            step.metrics[i] = outcome.metrics
            step.results[i] = outcome
            step.done[i] = episode.done
            step.reasons[i] = episode.reason
        return step

    def close(self) -> None:
        """End the current episodes (and their Python sessions, if any)."""
        # without sessions to release or hooks to run there is nothing to wait for
        if self._to_release():
            run_sync(self.aclose)
        for episode in self.episodes:
            episode._mark_closed()

    async def aclose(self) -> None:
        """Async :meth:`close`."""
        await aclose_all(self.episodes)

    def _to_release(self) -> bool:
        return any(
            not e.closed and (e.python is not None or e.shell is not None or e.finalize)
            for e in self.episodes
        )


def _response(response: str | Mapping[str, Any] | None) -> str | Mapping[str, Any]:
    return "" if response is None else response
