"""A framework-free multi-turn tool environment over OpenAI-format messages.

For trainers other than TorchRL: keep one conversation per batch item, feed
the policy's assistant responses in with :meth:`ToolEnv.step`, and get back
the tool messages to append, done flags with reasons, and metrics for reward
shaping. Nothing here imports torch.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from toolservices._portal import run_sync
from toolservices.dispatch import (
    Dispatcher,
    EpisodeMetrics,
    ItemResult,
    StepMetrics,
    render_tool_results,
    to_openai_messages,
)
from toolservices.errors import UserError
from toolservices.parsing.base import ParseResult, ToolParser, response_text
from toolservices.tools import ToolRegistry

__all__ = ["EnvStep", "ToolEnv"]

Message = dict[str, Any]
ResultFormat = Literal["openai", "tool_results"]


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
    turns whose calls were all malformed or failing (when set).
    """

    def __init__(
        self,
        tools: ToolRegistry | Iterable[Any],
        *,
        parser: str | ToolParser = "hermes",
        max_turns: int = 8,
        max_failed_turns: int | None = None,
        system_prompt: str | None = None,
        result_format: ResultFormat = "openai",
        max_concurrency: int = 64,
        timeout: float | None = 10.0,
        stop_on_error: bool = False,
    ) -> None:
        from toolservices.parsing import get_parser

        if max_turns < 1:
            raise UserError(f"max_turns must be at least 1, got {max_turns}")
        if max_failed_turns is not None and max_failed_turns < 1:
            raise UserError(f"max_failed_turns must be at least 1 or None, got {max_failed_turns}")
        if result_format not in ("openai", "tool_results"):
            raise UserError(
                f"Unknown result_format {result_format!r}; valid: 'openai', 'tool_results'"
            )
        self.registry = tools if isinstance(tools, ToolRegistry) else ToolRegistry(tools)
        self.parser = get_parser(parser, tools=self.registry)
        self.dispatcher = Dispatcher(
            self.registry,
            max_concurrency=max_concurrency,
            timeout=timeout,
            stop_on_error=stop_on_error,
        )
        self.max_turns = max_turns
        self.max_failed_turns = max_failed_turns
        self.system_prompt = system_prompt
        self.result_format: ResultFormat = result_format
        self.messages: list[list[Message]] = []
        self.done: list[bool] = []
        self.reasons: list[str | None] = []
        self.metrics: list[EpisodeMetrics] = []
        self._turns: list[int] = []
        self._failed_streak: list[int] = []

    @property
    def tool_specs(self) -> list[dict[str, Any]]:
        """OpenAI-style specs to pass to the chat template as ``tools=``."""
        return self.registry.openai_specs()

    @property
    def batch_size(self) -> int:
        return len(self.messages)

    def reset(self, prompts: Sequence[str | Sequence[Mapping[str, Any]]]) -> list[list[Message]]:
        """Start one episode per prompt (a user string or a message list)."""
        self.messages = []
        for prompt in prompts:
            if isinstance(prompt, str):
                conversation: list[Message] = []
                if self.system_prompt:
                    conversation.append({"role": "system", "content": self.system_prompt})
                conversation.append({"role": "user", "content": prompt})
            else:
                conversation = [dict(m) for m in prompt]
            self.messages.append(conversation)
        n = len(self.messages)
        self.done = [False] * n
        self.reasons = [None] * n
        self.metrics = [EpisodeMetrics() for _ in range(n)]
        self._turns = [0] * n
        self._failed_streak = [0] * n
        return self.messages

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
        active = [i for i in range(self.batch_size) if not self.done[i]]
        parsed: dict[int, ParseResult] = {}
        for i in active:
            response = responses[i]
            # A message dict goes to the parser whole: calls a server already
            # parsed into its ``tool_calls`` are read from there.
            parsed[i] = self.parser(response if isinstance(response, str) else dict(response or {}))
            self._turns[i] += 1
            self.messages[i].append(_assistant_message(response_text(response), parsed[i]))
        states = [{"batch_index": i, "turn": self._turns[i]} for i in active]
        outcomes = await self.dispatcher.arun([parsed[i] for i in active], states=states)

        step = EnvStep(
            tool_messages=[[] for _ in range(self.batch_size)],
            done=list(self.done),
            reasons=[None] * self.batch_size,
            metrics=[StepMetrics() for _ in range(self.batch_size)],
            results=[ItemResult() for _ in range(self.batch_size)],
        )
        for i, outcome in zip(active, outcomes, strict=True):
            new_messages = self._tool_messages(outcome)
            self.messages[i].extend(new_messages)
            self.metrics[i].add_step(outcome.metrics)
            step.tool_messages[i] = new_messages
            step.metrics[i] = outcome.metrics
            step.results[i] = outcome
            reason = self._finish_reason(i, outcome)
            if reason is not None:
                self.done[i] = True
                self.reasons[i] = reason
                step.done[i] = True
                step.reasons[i] = reason
        return step

    def _tool_messages(self, outcome: ItemResult) -> list[Message]:
        if not outcome.results:
            return []
        if self.result_format == "tool_results":
            return [{"role": "tool", "content": render_tool_results(outcome.results)}]
        return to_openai_messages(outcome.results)

    def _finish_reason(self, i: int, outcome: ItemResult) -> str | None:
        if not outcome.results:
            return "answered"
        metrics = outcome.metrics
        all_failed = metrics.failed_calls + metrics.parse_errors == len(outcome.results)
        self._failed_streak[i] = self._failed_streak[i] + 1 if all_failed else 0
        if self.max_failed_turns is not None and self._failed_streak[i] >= self.max_failed_turns:
            return "too_many_failures"
        if self._turns[i] >= self.max_turns:
            return "max_turns"
        return None


def _assistant_message(text: str, parsed: ParseResult) -> Message:
    message: Message = {"role": "assistant", "content": text}
    if parsed.calls:
        message["tool_calls"] = [
            {
                "id": call.id,
                "type": "function",
                "function": {"name": call.tool, "arguments": json.dumps(call.args)},
            }
            for call in parsed.calls
        ]
    return message
