"""Run many tool-using episodes against an OpenAI-compatible chat endpoint."""

from __future__ import annotations

import functools
import os
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import anyio

from toolservices._portal import run_sync
from toolservices.dispatch import ConcurrencyBound, StepMetrics
from toolservices.env import EpisodeHook, EpisodeSpec
from toolservices.errors import InfrastructureError, UserError
from toolservices.parsing import ParserLike
from toolservices.rollout._request import (
    RetryPolicy,
    assistant_message,
    request_completion,
    token_details,
)
from toolservices.rollout._trajectory import Trajectory, TurnRecord
from toolservices.tools import ToolRegistry

if TYPE_CHECKING:
    from openai import AsyncOpenAI

    from toolservices.env.episode import CloseReason, Episode
    from toolservices.python import PythonExecutorService

__all__ = ["Rollout", "rollout"]

Prompt = str | Sequence[Mapping[str, Any]]

#: Request fields the rollout sets itself; ``request_options`` may not override them.
_OWNED = frozenset({"messages", "model", "tools", "stream", "n", "timeout"})


class Rollout:
    """Episodes driven by a chat-completions endpoint (vLLM, SGLang, OpenAI...).

    Each episode sends its conversation with the tools' specs as ``tools=``,
    hands the answer to an :class:`~toolservices.Episode` (which runs the
    calls and appends the results) and repeats until the episode ends. At
    most ``max_concurrency`` episodes are in flight; their tool calls share
    one :class:`~toolservices.Dispatcher` (``max_tool_concurrency``).

    ``parser=None`` executes the calls the server parsed (``tool_calls``; a
    vLLM server started with ``--enable-auto-tool-choice --tool-call-parser``);
    a parser name parses the raw text on this side instead (server-parsed
    ``tool_calls`` are still used when a server sends them).

    Requests time out after ``request_timeout`` seconds and transient
    failures are retried per ``retry``; a request that still fails ends its
    episode with ``finish_reason="request_error"`` and the reason in
    ``error``, and the other episodes go on. ``logprobs`` (an int: 0 for the
    sampled tokens only, k for k alternatives too) and ``return_token_ids``
    (vLLM's extension) ask the server for what RL training needs;
    ``request_options`` go to every request as is (``temperature``,
    ``max_tokens``, ``tool_choice``, ``extra_body``...).

    ``setup(episode)`` runs before an episode's first request (its
    ``state`` is ``states[i]`` of :meth:`arun`: seed the repository),
    ``finalize(episode)`` after its last turn with the final workspace
    (run hidden tests, score): its return value is the trajectory's
    ``outcome``; an exception in either goes to that trajectory's
    ``error`` and the other episodes go on (see :class:`~toolservices.Episode`).
    ``keep_sessions=True`` leaves each episode's sessions open: their ids are
    in ``Trajectory.shell_session``/``python_session`` and the caller closes
    them. ``max_turns=8`` suits short tool use; coding agents want 30 or more.
    """

    def __init__(
        self,
        tools: ToolRegistry | Iterable[Any],
        *,
        model: str,
        base_url: str | None = None,
        api_key: str | None = None,
        client: AsyncOpenAI | None = None,
        parser: ParserLike = None,
        max_turns: int = 8,
        max_failed_turns: int | None = None,
        system_prompt: str | None = None,
        max_concurrency: int = 32,
        request_timeout: float = 120.0,
        retry: RetryPolicy | None = None,
        logprobs: int | None = None,
        return_token_ids: bool = False,
        request_options: Mapping[str, Any] | None = None,
        send_tools: bool = True,
        tool_timeout: float | None = 10.0,
        max_tool_concurrency: int = 64,
        python: PythonExecutorService | None = None,
        setup: EpisodeHook | None = None,
        finalize: EpisodeHook | None = None,
        keep_sessions: bool = False,
    ) -> None:
        if not model:
            raise UserError("Rollout needs model= (the name the server serves)")
        if client is not None and (base_url is not None or api_key is not None):
            raise UserError("pass either client= or base_url=/api_key=, not both")
        if max_concurrency < 1:
            raise UserError(f"max_concurrency must be at least 1, got {max_concurrency}")
        if max_turns < 1:
            raise UserError(f"max_turns must be at least 1, got {max_turns}")
        if request_timeout <= 0:
            raise UserError(f"request_timeout must be positive, got {request_timeout}")
        if logprobs is not None and logprobs < 0:
            raise UserError(f"logprobs must be None or >= 0, got {logprobs}")
        extra_body = (request_options or {}).get("extra_body") or {}
        owned = sorted(_OWNED & {*(request_options or {}), *extra_body})
        if owned:
            raise UserError(
                f"request_options may not set {owned}: the rollout sets them "
                "(use model=, request_timeout=, send_tools=)"
            )
        # checked now, not at the first episode; parser=None: the server's tool_calls only
        self.spec = EpisodeSpec(
            tools,
            parser=parser,
            system_prompt=system_prompt,
            max_turns=max_turns,
            max_failed_turns=max_failed_turns,
            python=python,
            max_concurrency=max_tool_concurrency,
            timeout=tool_timeout,
            setup=setup,
            finalize=finalize,
            keep_sessions=keep_sessions,
        )
        self.registry = self.spec.registry
        self.parser = self.spec.parser
        self.model = model
        self.max_turns = max_turns
        self.max_failed_turns = max_failed_turns
        self.system_prompt = system_prompt
        self.max_concurrency = max_concurrency
        # the rollout's own: concurrent arun calls share the max_concurrency episodes
        self._in_flight = ConcurrencyBound(max_concurrency)
        self.request_timeout = request_timeout
        self.retry = retry if retry is not None else RetryPolicy()
        self.tool_timeout = tool_timeout
        self.python = self.spec.python
        self.dispatcher = self.spec.dispatcher
        self._body, self._options = self._request_params(
            request_options or {}, logprobs, return_token_ids, send_tools
        )
        self._owns_client = client is None
        # Retries are ours (bounded, visible in the trajectory), never the SDK's too.
        self.client = (
            client.with_options(max_retries=0)
            if client is not None
            else _make_client(base_url, api_key)
        )

    def _request_params(
        self,
        request_options: Mapping[str, Any],
        logprobs: int | None,
        return_token_ids: bool,
        send_tools: bool,
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        """The JSON body (all but ``messages``) and the SDK options of every request."""
        body = dict(request_options)
        options: dict[str, Any] = {}
        if "extra_headers" in body:
            options["headers"] = dict(body.pop("extra_headers") or {})
        if "extra_query" in body:
            options["params"] = dict(body.pop("extra_query") or {})
        body.update(body.pop("extra_body", None) or {})
        body["model"] = self.model
        specs = self.registry.openai_specs()
        if send_tools and specs:
            body["tools"] = specs
        if logprobs is not None:
            body["logprobs"] = True
            if logprobs:
                body["top_logprobs"] = logprobs
        if return_token_ids:
            body["return_token_ids"] = True
        return body, options

    # -- running -----------------------------------------------------------

    async def arun(
        self,
        prompts: Sequence[Prompt],
        *,
        states: Sequence[Mapping[str, Any]] | None = None,
    ) -> list[Trajectory]:
        """Run one episode per prompt (a user string or a message list); trajectories in order.

        ``states[i]`` seeds episode i's ``state`` (the tools see it in ``_state``).
        """
        if states is not None and len(states) != len(prompts):
            raise UserError(f"got {len(states)} states for {len(prompts)} prompts")
        for index, prompt in enumerate(prompts):
            if not isinstance(prompt, str) and not (
                isinstance(prompt, Sequence) and all(isinstance(m, Mapping) for m in prompt)
            ):
                raise UserError(
                    f"prompts[{index}] must be a user message string or a list of message "
                    f"dicts, got {type(prompt).__name__}"
                )
        results: list[Trajectory | None] = [None] * len(prompts)
        in_flight = self._in_flight

        async def one(index: int) -> None:
            if not in_flight.try_acquire():
                await in_flight.acquire()
            try:
                state = states[index] if states is not None else None
                results[index] = await self._episode(index, prompts[index], state)
            finally:
                in_flight.release()

        async with anyio.create_task_group() as tg:
            for index in range(len(prompts)):
                tg.start_soon(one, index)
        return [t for t in results if t is not None]

    def run(
        self,
        prompts: Sequence[Prompt],
        *,
        states: Sequence[Mapping[str, Any]] | None = None,
    ) -> list[Trajectory]:
        """Synchronous :meth:`arun` (on the library's background loop).

        The client's connections belong to the loop that first used them: call
        either :meth:`run` or :meth:`arun` on one rollout, not both.
        """
        return run_sync(functools.partial(self.arun, prompts, states=states))

    def new_episode(self, prompt: Prompt, state: Mapping[str, Any] | None = None) -> Episode:
        """The :class:`~toolservices.Episode` a prompt starts (tools, parser, limits)."""
        return self.spec.new_episode(prompt=prompt, state=state)

    async def _episode(
        self, index: int, prompt: Prompt, state: Mapping[str, Any] | None
    ) -> Trajectory:
        started = time.perf_counter()
        episode = self.new_episode(prompt, state)
        trajectory = Trajectory(
            index=index,
            episode_id=episode.id,
            messages=episode.messages,
            turns=[],
            metrics=episode.metrics,
            finish_reason="running",
        )
        reason: CloseReason = "closed"
        try:
            # A tool's backend failing during a call (InfrastructureError) is a failed
            # call the model reads (the dispatcher's rule); nothing in a step raises it.
            try:
                error = None
                if await episode.astart():  # False: setup failed (episode.error)
                    error = await self._drive(episode, trajectory)
                if error is not None:
                    reason, trajectory.error = "request_error", error
            finally:
                # ends the episode with what stopped it (a finished one keeps its
                # reason) and releases its Python session, if any
                await episode.aclose(reason=reason)
            trajectory.finish_reason = episode.reason or "closed"
        except InfrastructureError as exc:  # a session that cannot close
            trajectory.finish_reason = "infrastructure_error"
            trajectory.error = f"{type(exc).__name__}: {exc}"
        if episode.error is not None:
            trajectory.error = (
                episode.error
                if trajectory.error is None
                else f"{trajectory.error}; {episode.error}"
            )
        trajectory.outcome = episode.outcome
        if episode.keep_sessions:
            trajectory.shell_session = episode.shell_session
            trajectory.python_session = episode.python_session
        trajectory.messages = episode.messages
        trajectory.metrics = episode.metrics
        trajectory.state = episode.state
        trajectory.wall_time = time.perf_counter() - started
        return trajectory

    async def _drive(self, episode: Episode, trajectory: Trajectory) -> str | None:
        """Ask and step until the episode ends; the request error that stopped it, if any."""
        while not episode.done:
            answer = await request_completion(
                self.client,
                messages=episode.messages,
                body=self._body,
                options=self._options,
                request_timeout=self.request_timeout,
                retry=self.retry,
            )
            trajectory.requests += answer.attempts
            trajectory.request_time += answer.elapsed
            if answer.error is not None:
                return answer.error
            choice = answer.completion.choices[0]
            message = assistant_message(choice)
            record = TurnRecord(
                message=message,
                tool_messages=[],
                finish_reason=getattr(choice, "finish_reason", None),
                attempts=answer.attempts,
                request_time=answer.elapsed,
                **token_details(answer.completion),
            )
            trajectory.turns.append(record)
            record.tool_messages = await episode.astep(message)
            record.metrics = episode.last.metrics if episode.last is not None else StepMetrics()
        return None

    # -- lifecycle ---------------------------------------------------------

    async def aclose(self) -> None:
        """Close the HTTP client if this rollout made it."""
        if self._owns_client:
            await self.client.close()

    def close(self) -> None:
        """Synchronous :meth:`aclose`."""
        run_sync(self.aclose)

    def __enter__(self) -> Rollout:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    async def __aenter__(self) -> Rollout:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


def _make_client(base_url: str | None, api_key: str | None) -> AsyncOpenAI:
    try:
        from openai import AsyncOpenAI
    except ImportError as exc:
        raise UserError(
            "toolservices.rollout needs the openai SDK: pip install 'toolservices[rollout]'"
        ) from exc
    # Local servers (vLLM, SGLang) accept any key; the SDK insists on one.
    key = api_key if api_key is not None else os.environ.get("OPENAI_API_KEY", "EMPTY")
    return AsyncOpenAI(base_url=base_url, api_key=key, max_retries=0)


async def rollout(
    prompts: Sequence[Prompt],
    tools: ToolRegistry | Iterable[Any],
    *,
    model: str,
    states: Sequence[Mapping[str, Any]] | None = None,
    **options: Any,
) -> list[Trajectory]:
    """One-shot :class:`Rollout`: run ``prompts`` and close the client."""
    async with Rollout(tools, model=model, **options) as runner:
        return await runner.arun(prompts, states=states)
