"""What a rollout returns: one :class:`Trajectory` per episode, one :class:`TurnRecord` per turn."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from toolservices.dispatch import EpisodeMetrics, StepMetrics

__all__ = ["Trajectory", "TurnRecord"]


@dataclass(kw_only=True)
class TurnRecord:
    """One assistant turn: what the server returned and what the tools answered.

    Token ids and log-probabilities are ``None`` unless the server returned
    them (ask with ``return_token_ids=True`` / ``logprobs=``).
    """

    #: The assistant message as the server returned it (``content``,
    #: ``tool_calls``, and any extra fields such as ``reasoning_content``).
    message: dict[str, Any]
    #: The messages appended after it (tool results), as the conversation has them.
    tool_messages: list[dict[str, Any]]
    #: The server's ``finish_reason``: ``stop``, ``tool_calls``, ``length``...
    finish_reason: str | None
    #: What this turn's calls did (calls, failures, parse errors, tool time).
    metrics: StepMetrics = field(default_factory=StepMetrics)
    #: The prompt's token ids (vLLM's ``prompt_token_ids``).
    prompt_token_ids: list[int] | None = None
    #: The completion's token ids (vLLM's per-choice ``token_ids``).
    completion_token_ids: list[int] | None = None
    #: The sampled tokens and their log-probabilities (``logprobs.content``).
    tokens: list[str] | None = None
    logprobs: list[float] | None = None
    #: Per position, the top alternatives (token -> logprob), when asked for.
    top_logprobs: list[dict[str, float]] | None = None
    #: The server's ``usage`` block (prompt/completion/total tokens).
    usage: dict[str, Any] | None = None
    #: HTTP attempts this turn took (1 without retries).
    attempts: int = 1
    #: Seconds from the first attempt to the answer, retries and backoff included.
    request_time: float = 0.0


@dataclass(kw_only=True)
class Trajectory:
    """One episode of a rollout, in the order its prompt was given."""

    index: int
    episode_id: str
    #: The whole conversation (OpenAI format), prompt included.
    messages: list[dict[str, Any]]
    turns: list[TurnRecord]
    metrics: EpisodeMetrics
    #: ``answered``, ``max_turns``, ``too_many_failures`` (from the episode), or
    #: ``request_error`` (the server could not be used: see :attr:`error`) or
    #: ``infrastructure_error`` (the episode's Python session could not be released),
    #: or ``setup_error`` (the ``setup`` hook raised: see :attr:`error`).
    finish_reason: str
    #: Why the episode stopped early (``request_error``, ``infrastructure_error``,
    #: ``setup_error``), or what ``finalize`` raised ("finalize failed: ...").
    error: str | None = None
    #: What the rollout's ``finalize`` hook returned (a reward, test results...).
    outcome: Any = None
    #: The episode's sessions, left open with ``keep_sessions=True`` (the caller
    #: closes them: ``shell.close_session(...)``); None without such tools.
    shell_session: str | None = None
    python_session: str | None = None
    #: The episode's state dict at the end (the tools may have written to it).
    state: dict[str, Any] = field(default_factory=dict)
    #: HTTP attempts over all turns, the failing one included.
    requests: int = 0
    #: Seconds spent waiting for the server, retries and backoff included.
    request_time: float = 0.0
    #: Seconds from the episode's start (after admission) to its end.
    wall_time: float = 0.0

    @property
    def retries(self) -> int:
        """Attempts beyond the first of each request."""
        return self.requests - len(self.turns) - (1 if self.finish_reason == "request_error" else 0)

    @property
    def ok(self) -> bool:
        """True unless the server, the infrastructure or a failed ``setup`` ended the episode."""
        return self.finish_reason not in ("request_error", "infrastructure_error", "setup_error")

    def to_dict(self) -> dict[str, Any]:
        """The fields as plain data, with ``retries`` (JSON-serialisable when ``state`` is)."""
        data = dataclasses.asdict(self)
        data["retries"] = self.retries
        return data
