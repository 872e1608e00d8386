"""One trajectory in which a model calls tools: the per-episode core.

An :class:`Episode` owns what belongs to one rollout: its conversation, its
per-episode ``state``, its metrics, its failure streak and, with an executor,
its own Python session. Episodes step independently (no batch barrier): a
trainer or rollout driver calls :meth:`Episode.astep` (or the sync
:meth:`Episode.step`) whenever the model has answered, and many episodes
sharing one :class:`~toolservices.Dispatcher` stay within its
``max_concurrency`` (the dispatcher owns that bound). :class:`~toolservices.ToolEnv` (batched,
lockstep) and the TorchRL transforms are thin layers over this class.
"""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import functools
import json
import typing
import uuid
import weakref
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Literal

import anyio

from toolservices import _portal
from toolservices.dispatch import (
    CallResult,
    ConcurrencyBound,
    Dispatcher,
    EpisodeMetrics,
    EpisodeState,
    ItemResult,
    render_tool_results,
    to_openai_messages,
)
from toolservices.env._hooks import EpisodeHook, call_hook, check_hook
from toolservices.env._python_tool import PYTHON_SESSION_KEY, PythonTool
from toolservices.env._shell_tools import SHELL_SESSION_KEY, ShellTool
from toolservices.errors import UserError
from toolservices.parsing import ParserLike, as_parser
from toolservices.parsing.base import ParseResult, ToolCall, response_text
from toolservices.tools import ToolRegistry

if TYPE_CHECKING:
    from toolservices.python import PythonExecutorService
    from toolservices.shell import ShellService

__all__ = [
    "CLOSE_REASONS",
    "CloseReason",
    "EndReason",
    "Episode",
    "Message",
    "ResultFormat",
    "aclose_all",
    "afinalize_all",
    "check_limits",
    "on_dispatcher",
    "render_messages",
    "resolve_python",
]

Message = dict[str, Any]
ResultFormat = Literal["openai", "tool_results"]
#: Why an episode ended: ``answered`` (a turn without calls), ``max_turns``,
#: ``too_many_failures`` (``max_failed_turns`` failed turns in a row), or closed
#: from outside while still running (:meth:`Episode.aclose`): ``closed`` (by its
#: owner), ``request_error`` (the model could not be asked: a server failure) or
#: ``infrastructure_error`` (the tools' backend failed); ``setup_error``: the
#: episode's ``setup`` hook raised (see :attr:`Episode.error`), no turn ran.
EndReason = Literal[
    "answered",
    "max_turns",
    "too_many_failures",
    "closed",
    "request_error",
    "infrastructure_error",
    "setup_error",
]
#: The reasons :meth:`Episode.aclose` can give an episode it ends.
CloseReason = Literal["closed", "request_error", "infrastructure_error"]
CLOSE_REASONS: tuple[CloseReason, ...] = typing.get_args(CloseReason)
Prompt = str | Sequence[Mapping[str, Any]] | None


class Episode:
    """One trajectory: its tools, parser, Python session, state and metrics.

    ``await astep(response)`` (or the sync ``step(response)``) appends the
    assistant turn, runs its tool calls and appends and returns the tool
    messages (OpenAI format). The episode ends
    (``done``, with ``reason``) when a response makes no call
    (``"answered"``, unless ``end_on_answer=False``), after ``max_turns``
    turns (``None``: no limit), after ``max_failed_turns`` consecutive turns
    whose calls all failed or were malformed, or on :meth:`aclose` (which
    can give a failure from outside as the reason: see :data:`EndReason`).

    ``parser=None``: only the calls a server parsed into the message's
    ``tool_calls`` run; the text is never parsed
    (:class:`~toolservices.parsing.ServerCallsParser`). Any ``parser=`` goes
    through :func:`~toolservices.parsing.as_parser`.

    Sharing: pass one ``dispatcher`` to many episodes to put all their calls
    under its ``max_concurrency`` (the calls run against *this* episode's
    tools, with this episode's ``timeout``, ``stop_on_error`` and
    ``pass_state``, on ``dispatcher.with_options(...)``, which shares the
    bound). Parsers and registries given as objects are shared too.

    State: tools that take ``_state`` get :attr:`state` with the standard
    entries (``episode_id``, ``turn``, ``call_index``, ``python_session``) and
    ``context`` over it; what they write to the other keys persists in
    :attr:`state` for later calls of this episode (never of another).

    Python: with ``python`` (an executor), the episode's ``python_session``
    (its id, the interpreter is created on first use) goes to the tools in
    ``_state["python_session"]``; :func:`~toolservices.python_tool` runs code
    there. If ``python`` is not given and the tools include a ``python_tool``,
    its executor is used. :meth:`aclose` (or ``async with``) ends the session.

    Shell: when the tools include shell tools (:func:`~toolservices.shell_tools`,
    or ``python_tool(shell=...)``), the episode has its own ``shell_session``
    on their service (created on first use, forked by :meth:`fork`, ended by
    :meth:`aclose`), handed to them in ``_state["shell_session"]``.

    Lifecycle: ``setup(episode)`` runs once before the first turn (:meth:`astart`;
    the first step runs it if the driver did not), with the sessions at hand
    (``shell_session``, ``python_session``, created on first use) and
    :attr:`state` holding what the driver was given for this episode: seed
    files, start services. ``finalize(episode)`` runs once after the last
    turn (:meth:`afinalize`; :meth:`aclose` runs it first), before the sessions
    close, with the final workspace intact; its return value is
    :attr:`outcome` (a reward, test results...). Either may be sync (run in
    a worker thread, so it may use the services' sync API) or async. An
    exception in either is recorded in :attr:`error` (a failed setup ends
    the episode with reason ``"setup_error"``; finalize then does not run),
    never raised; the sessions still close. ``keep_sessions=True``:
    :meth:`aclose` leaves the sessions open and the caller closes them
    (``shell.close_session(episode.shell_session)``,
    ``python.close_session(episode.python_session)``; closing the service
    ends them too).

    ``max_turns`` defaults to 8, right for short tool use; a coding agent
    that reads, edits and tests wants 30 or more (or ``None``).
    """

    def __init__(
        self,
        tools: ToolRegistry | Iterable[Any],
        *,
        parser: ParserLike | None = "hermes",
        prompt: Prompt = None,
        system_prompt: str | None = None,
        max_turns: int | None = 8,
        max_failed_turns: int | None = None,
        result_format: ResultFormat = "openai",
        timeout: float | None = 10.0,
        dispatcher: Dispatcher | None = None,
        python: PythonExecutorService | None = None,
        episode_id: str | None = None,
        state: Mapping[str, Any] | None = None,
        context: Mapping[str, Any] | None = None,
        stop_on_error: bool = False,
        pass_state: bool = True,
        end_on_answer: bool = True,
        setup: EpisodeHook | None = None,
        finalize: EpisodeHook | None = None,
        keep_sessions: bool = False,
    ) -> None:
        check_limits(max_turns, max_failed_turns, result_format)
        check_hook("setup", setup)
        check_hook("finalize", finalize)
        registry = tools if isinstance(tools, ToolRegistry) else ToolRegistry(tools)
        self.registry = registry
        self.parser = as_parser(parser, tools=registry)
        self.python = resolve_python(registry, python)
        self.shell = _resolve_shell(registry)
        if dispatcher is None:
            dispatcher = Dispatcher(registry, timeout=timeout)
        if (
            dispatcher.registry is registry
            and dispatcher.timeout == timeout
            and dispatcher.stop_on_error == stop_on_error
            and dispatcher.pass_state == pass_state
        ):
            self._dispatcher = dispatcher
        else:  # the shared bound, this episode's tools and settings
            self._dispatcher = dispatcher.with_options(
                registry=registry,
                timeout=timeout,
                stop_on_error=stop_on_error,
                pass_state=pass_state,
            )
        self.dispatcher = dispatcher
        self.max_turns = max_turns
        self.max_failed_turns = max_failed_turns
        self.result_format: ResultFormat = result_format
        self.end_on_answer = end_on_answer
        self.id: str = episode_id if episode_id is not None else f"ep-{uuid.uuid4().hex[:16]}"
        # unique even when two episodes are given the same id: state never crosses episodes
        self.python_session: str | None = (
            f"{self.id}:{uuid.uuid4().hex[:8]}" if self.python is not None else None
        )
        self.shell_session: str | None = (
            f"{self.id}:sh-{uuid.uuid4().hex[:8]}" if self.shell is not None else None
        )
        self.messages: list[Message] = _conversation(prompt, system_prompt)
        self.state: dict[str, Any] = dict(state or {})
        #: Read-only ``_state`` entries of every call (a layer's ``batch_index``...).
        self.context: dict[str, Any] = dict(context or {})
        self.done = False
        self.reason: EndReason | None = None
        self.turns = 0
        self.failed_streak = 0
        self.metrics = EpisodeMetrics()
        self.last: ItemResult | None = None
        self.closed = False
        self.setup = setup
        self.finalize = finalize
        self.keep_sessions = keep_sessions
        #: What ``finalize`` returned (None until it ran, or without one).
        self.outcome: Any = None
        #: What went wrong in ``setup`` or ``finalize`` ("setup failed: ..."), else None.
        self.error: str | None = None
        self._started = False
        self._finalized = False
        self._busy = False
        #: Orders the turns handed over by :meth:`astep_calls` (any loop may wait on it).
        self._turns = ConcurrencyBound(1)
        self._finalizer = self._watch_session()
        self._shell_finalizer = self._watch_shell()

    # -- views -----------------------------------------------------------------------------

    @property
    def tool_specs(self) -> list[dict[str, Any]]:
        """OpenAI-style specs to pass to the chat template (or API) as ``tools=``."""
        return self.registry.openai_specs()

    def __repr__(self) -> str:
        status = f"done={self.reason}" if self.done else "running"
        return f"Episode({self.id!r}, turns={self.turns}, {status})"

    # -- stepping --------------------------------------------------------------------------

    def step(self, response: str | Mapping[str, Any]) -> list[Message]:
        """Synchronous :meth:`astep`, through the library's background loop."""
        return _portal.run_sync(functools.partial(self.astep, response))

    async def astep(self, response: str | Mapping[str, Any]) -> list[Message]:
        """Append the assistant turn, run its calls, append and return the tool messages.

        ``response`` is the model's text, or an assistant message dict whose
        server-parsed ``tool_calls`` are used when present. Sets ``done`` and
        ``reason``. Never raises for anything the model or a tool did; raises
        :class:`UserError` when the episode is done or already stepping.
        """
        if not self._started and not self.done and not await self.astart():
            return []  # setup failed: the episode ended before its first turn (see error)
        outcome = await self.arun_turn(response)
        return self._append_turn(response, outcome)

    async def astep_calls(self, calls: Sequence[ToolCall], *, text: str = "") -> list[Message]:
        """:meth:`astep` for calls the caller has already parsed (a trainer's).

        The calls run as a turn whose response is ``text`` with these calls:
        no parser and no JSON text in between; the assistant message appended
        carries them as ``tool_calls``. Calls handed over while such a turn
        runs wait for it, then run in the order they came: trainers run one
        response's calls concurrently (verl gathers them), and an episode
        steps one turn at a time. Raises :class:`UserError` when the episode
        is done (also when it ended while this call waited).
        """
        turns = self._turns
        if not turns.try_acquire():
            await turns.acquire()
        try:
            if not self._started and not self.done and not await self.astart():
                return []
            self._check_usable("step")
            outcome = await self._arun_parsed(ParseResult(text, list(calls)))
            return self._append_turn(text, outcome)
        finally:
            turns.release()

    def run_turn(self, response: str | Mapping[str, Any]) -> ItemResult:
        """Synchronous :meth:`arun_turn`."""
        return _portal.run_sync(functools.partial(self.arun_turn, response))

    async def arun_turn(self, response: str | Mapping[str, Any]) -> ItemResult:
        """Parse and run one turn, update turns, metrics and ``done``; return the results.

        Unlike :meth:`astep` this leaves :attr:`messages` alone and renders
        nothing: for layers that keep the conversation themselves (TorchRL's
        ``History``) and format results their own way. A failed ``setup``
        gives an empty result (the episode is done, see :attr:`error`).
        """
        if not self._started and not self.done and not await self.astart():
            return ItemResult()
        self._check_usable("step")
        return await self._arun_parsed(self._parse(response))

    async def _arun_parsed(self, parsed: ParseResult) -> ItemResult:
        call_state = self._call_state()
        self._busy = True
        try:
            outcome = await self._dispatcher.arun_item(parsed, state=call_state)
        finally:
            self._busy = False
        self.record_turn(outcome)
        return outcome

    def _begin_turn(self, response: str | Mapping[str, Any]) -> tuple[ParseResult, EpisodeState]:
        """Check the episode can step, parse ``response``; the calls and their ``_state``.

        Changes nothing: a batch layer (ToolEnv) begins every item's turn,
        runs all their calls as one dispatch, then records each outcome.
        """
        self._check_usable("step")
        return self._parse(response), self._call_state()

    def _parse(self, response: str | Mapping[str, Any]) -> ParseResult:
        if type(response) is not str:  # the common case skips the ABC check
            if not isinstance(response, Mapping):
                raise UserError(
                    "step() takes the model's text or an assistant message dict, "
                    f"got {type(response).__name__}"
                )
            response = dict(response)
        return self.parser(response)

    def _append_turn(self, response: str | Mapping[str, Any], outcome: ItemResult) -> list[Message]:
        """Append the assistant message and the tool messages of a recorded turn."""
        messages = self.render(outcome)
        self.messages.append(self._assistant_message(response, outcome))
        self.messages.extend(messages)
        return messages

    def record_turn(self, outcome: ItemResult) -> EndReason | None:
        """Count one turn's results: metrics, failure streak, ``done``/``reason``.

        :meth:`arun_turn` calls it; layers that run a turn's calls by other
        means (TorchRL's per-item hook) call it with their outcome. Returns
        the reason when this turn ended the episode.
        """
        self.turns += 1
        self.last = outcome
        self.metrics.add_step(outcome.metrics)
        results = outcome.results
        metrics = outcome.metrics
        all_failed = bool(results) and metrics.failed_calls + metrics.parse_errors >= len(results)
        # a turn without calls, or with one call that worked, breaks the streak
        self.failed_streak = self.failed_streak + 1 if all_failed else 0
        reason: EndReason | None = None
        if not results and self.end_on_answer:
            reason = "answered"
        elif self.max_failed_turns is not None and self.failed_streak >= self.max_failed_turns:
            reason = "too_many_failures"
        elif self.max_turns is not None and self.turns >= self.max_turns:
            reason = "max_turns"
        if reason is not None:
            self.done = True
            self.reason = reason
        return reason

    def render(self, outcome: ItemResult) -> list[Message]:
        """The tool messages for ``outcome`` in this episode's ``result_format``."""
        return render_messages(outcome.results, self.result_format)

    def _call_state(self) -> EpisodeState:
        """The next turn's ``_state``: :attr:`state` under ``context`` and the standard entries.

        Each call gets its own dict; what a tool writes to the user's keys
        goes back into :attr:`state` once the call has ended.
        """
        standard = {
            **self.context,
            "episode_id": self.id,
            "turn": self.turns + 1,
            PYTHON_SESSION_KEY: self.python_session,
        }
        if self.shell is not None:
            standard[SHELL_SESSION_KEY] = self.shell_session
        return EpisodeState(self.state, standard)

    def _assistant_message(self, response: str | Mapping[str, Any], outcome: ItemResult) -> Message:
        message: Message = {"role": "assistant", "content": response_text(response)}
        calls = outcome.parse.calls if outcome.parse is not None else []
        if calls:
            # the ids the tool messages carry, so the two always match (the
            # dispatcher answers a response's calls first, in order)
            results = outcome.results
            message["tool_calls"] = [
                {
                    "id": results[index].call_id
                    if index < len(results) and results[index].index == index
                    else call.id,
                    "type": "function",
                    "function": {
                        "name": call.tool,
                        "arguments": json.dumps(call.args, default=str),
                    },
                }
                for index, call in enumerate(calls)
            ]
        return message

    def _check_usable(self, action: str) -> None:
        if self.done:
            raise UserError(
                f"cannot {action} episode {self.id!r}: it is done (reason: {self.reason})"
            )
        if self._busy:
            raise UserError(f"cannot {action} episode {self.id!r}: a step() is still running")

    # -- GRPO groups -----------------------------------------------------------------------

    def fork(self, n: int) -> list[Episode]:
        """Synchronous :meth:`afork`."""
        return _portal.run_sync(self.afork, n)

    async def afork(self, n: int) -> list[Episode]:
        """``n`` copies that go on independently from here.

        Each copy gets a copy of the messages, ``state`` (deep-copied),
        metrics, counters and, with an executor, of the Python session (its
        variables and working-directory files, via ``fork_session``), and of
        the shell session (workspace files, working directory, exported
        variables). Copies share the tools, parser and concurrency bound.
        """
        if n < 1:
            raise UserError(f"fork() needs n >= 1, got {n}")
        if self.closed:
            raise UserError(f"cannot fork episode {self.id!r}: it was closed")
        if self._busy:
            raise UserError(f"cannot fork episode {self.id!r}: a step() is still running")
        try:
            states = [copy.deepcopy(self.state) for _ in range(n)]
        except Exception as exc:  # an uncopyable object in the user's state
            raise UserError(
                f"cannot fork episode {self.id!r}: its state could not be copied ({exc})"
            ) from exc
        sessions: list[str | None] = [None] * n
        shells: list[str | None] = [None] * n
        self._busy = True
        try:
            if self.python is not None and self.python_session is not None:
                # fork_session copies a live interpreter: make sure there is one
                await self.python.aexecute("pass", session_id=self.python_session)
                sessions = list(await self.python.afork_session(self.python_session, n))
            if self.shell is not None and self.shell_session is not None:
                try:
                    await self.shell.arun("true", session_id=self.shell_session)
                    shells = list(await self.shell.afork_session(self.shell_session, n))
                except BaseException:
                    with anyio.CancelScope(shield=True):
                        await _discard_sessions(self.python, [s for s in sessions if s])
                    raise
        finally:
            self._busy = False
        return [self._copy(states[k], sessions[k], shells[k]) for k in range(n)]

    def _copy(self, state: dict[str, Any], session: str | None, shell: str | None) -> Episode:
        twin = copy.copy(self)
        twin.id = f"{self.id}/{uuid.uuid4().hex[:8]}"
        twin.python_session = session
        twin.shell_session = shell
        twin.messages = copy.deepcopy(self.messages)
        twin.state = state
        twin.metrics = dataclasses.replace(self.metrics)
        twin._turns = ConcurrencyBound(1)
        twin._finalizer = twin._watch_session()
        twin._shell_finalizer = twin._watch_shell()
        return twin

    def _watch_session(self) -> weakref.finalize[Any, Any] | None:
        """A safety net: an episode dropped without :meth:`aclose` still ends its session."""
        if self.python is None or self.python_session is None:
            return None
        finalizer = weakref.finalize(self, _release_session, self.python, self.python_session)
        finalizer.atexit = False  # at exit the executor's own shutdown ends every session
        return finalizer

    def _watch_shell(self) -> weakref.finalize[Any, Any] | None:
        """The same safety net for the shell session."""
        if self.shell is None or self.shell_session is None:
            return None
        finalizer = weakref.finalize(self, _release_session, self.shell, self.shell_session)
        finalizer.atexit = False
        return finalizer

    # -- lifecycle -------------------------------------------------------------------------

    def start(self) -> bool:
        """Synchronous :meth:`astart`."""
        return _portal.run_sync(self.astart)

    async def astart(self) -> bool:
        """Run ``setup`` (once); False when it failed (the episode is then done).

        Drivers call it before asking the model for the first turn; the
        first step calls it otherwise. Without a ``setup`` it only marks the
        episode started.
        """
        if self._started:
            return self.reason != "setup_error"
        self._started = True
        if self.setup is None or self.closed:
            return not self.closed
        self._busy = True  # a step meanwhile is refused, as during another step
        try:
            await call_hook(self.setup, self)
        except Exception as exc:  # the user's hook: recorded on this episode, never raised
            self.error = f"setup failed: {type(exc).__name__}: {exc}"
            if not self.done:
                self.done = True
                self.reason = "setup_error"
            return False
        finally:
            self._busy = False
        return True

    def run_finalize(self) -> Any:
        """Synchronous :meth:`afinalize`."""
        return _portal.run_sync(self.afinalize)

    @property
    def finalized(self) -> bool:
        """Whether :meth:`afinalize` has run (its :attr:`outcome` is then final)."""
        return self._finalized

    async def afinalize(self) -> Any:
        """Run ``finalize`` (once) on the final workspace; its return value (:attr:`outcome`).

        :meth:`aclose` calls it before closing the sessions; call it yourself
        to get the outcome earlier (a trainer's reward). It runs only when
        the episode started (a turn ran or :meth:`astart` was called) and its
        setup did not fail. An exception is recorded in :attr:`error`.
        """
        if self._finalized:
            return self.outcome
        self._finalized = True
        if self.finalize is None or not self._started or self.reason == "setup_error":
            return self.outcome
        try:
            self.outcome = await call_hook(self.finalize, self)
        except Exception as exc:  # the user's hook: recorded on this episode, never raised
            message = f"finalize failed: {type(exc).__name__}: {exc}"
            self.error = message if self.error is None else f"{self.error}; {message}"
        return self.outcome

    def close(self, *, reason: CloseReason = "closed") -> None:
        """Synchronous :meth:`aclose`."""
        _portal.run_sync(functools.partial(self.aclose, reason=reason))

    async def aclose(self, *, reason: CloseReason = "closed") -> None:
        """End the episode and release its Python session; idempotent.

        An episode still running gets ``reason``: ``"closed"``, or what ended
        it from outside, ``"request_error"`` (its driver could not get the
        model's next answer) or ``"infrastructure_error"``. A finished
        episode keeps its own reason, and the first close wins.

        ``finalize`` runs first (once, see :meth:`afinalize`); with
        ``keep_sessions=True`` the sessions are then left open for the caller.
        """
        if reason not in CLOSE_REASONS:
            self._mark_closed(reason)  # raises the UserError naming the valid reasons
        if self.closed:
            return
        if not self.done:
            self.done = True
            self.reason = reason
        try:
            await self.afinalize()
        finally:
            await self._release(reason)

    async def _release(self, reason: CloseReason) -> None:
        shell = self.shell_session if not self.closed and self.shell is not None else None
        session = self._mark_closed(reason)
        if self.keep_sessions:
            return  # the caller's now (the safety nets were detached by _mark_closed)
        with anyio.CancelScope(shield=True):
            try:
                if session is not None and self.python is not None:
                    await self.python.aclose_session(session)
            finally:
                if shell is not None and self.shell is not None:
                    await self.shell.aclose_session(shell)

    def _mark_closed(self, reason: CloseReason = "closed") -> str | None:
        """Mark the episode closed; the Python session still to release, if any."""
        if reason not in CLOSE_REASONS:
            valid = ", ".join(repr(r) for r in CLOSE_REASONS)
            raise UserError(f"Unknown close reason {reason!r}; valid: {valid}")
        if self.closed:
            return None
        self.closed = True
        if self._finalizer is not None:
            self._finalizer.detach()
        if self._shell_finalizer is not None:
            self._shell_finalizer.detach()
        if not self.done:
            self.done = True
            self.reason = reason
        return self.python_session if self.python is not None else None

    async def __aenter__(self) -> Episode:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    def __enter__(self) -> Episode:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


async def afinalize_all(episodes: Iterable[Episode]) -> None:
    """Run every episode's ``finalize`` concurrently (each records its own failure)."""
    async with anyio.create_task_group() as tg:
        for episode in episodes:
            tg.start_soon(episode.afinalize)


async def aclose_all(episodes: Iterable[Episode]) -> None:
    """Close every episode, concurrently, even when releasing some sessions fails.

    Each episode is marked closed at once; a failed release does not keep
    the other episodes' sessions open. The first failure is raised after
    all are done (one exception, not a group).
    """
    failures: list[BaseException] = []

    async def close(episode: Episode) -> None:
        try:
            await episode.aclose()
        except Exception as exc:  # kept, and raised once every episode is closed
            failures.append(exc)

    async with anyio.create_task_group() as tg:
        for episode in episodes:
            tg.start_soon(close, episode)
    if failures:
        raise failures[0]


def on_dispatcher(dispatcher: Dispatcher) -> dict[str, Any]:
    """Episode options to run on ``dispatcher`` as configured (its object, its settings).

    For layers that build every episode on their own dispatcher (ToolEnv,
    TorchRL, rollouts): ``Episode(tools, **on_dispatcher(d), ...)``.
    """
    return {
        "dispatcher": dispatcher,
        "timeout": dispatcher.timeout,
        "stop_on_error": dispatcher.stop_on_error,
        "pass_state": dispatcher.pass_state,
    }


def render_messages(results: Sequence[CallResult], result_format: ResultFormat) -> list[Message]:
    """Tool messages for one turn's results: one per call (``openai``, with its
    ``tool_call_id``) or one ``<tool_results>`` block (``tool_results``)."""
    if not results:
        return []
    if result_format == "tool_results":
        return [{"role": "tool", "content": render_tool_results(results)}]
    return to_openai_messages(results)


def check_limits(max_turns: int | None, max_failed_turns: int | None, result_format: str) -> None:
    """Raise :class:`UserError` for options an episode (or a batch of them) cannot use."""
    if max_turns is not None and max_turns < 1:
        raise UserError(f"max_turns must be at least 1 or None, got {max_turns}")
    if max_failed_turns is not None and max_failed_turns < 1:
        raise UserError(f"max_failed_turns must be at least 1 or None, got {max_failed_turns}")
    if result_format not in ("openai", "tool_results"):
        raise UserError(f"Unknown result_format {result_format!r}; valid: 'openai', 'tool_results'")


async def _discard_sessions(service: PythonExecutorService | None, sessions: list[str]) -> None:
    """Close ``sessions`` of ``service`` (forks a failed fork made); failures are not raised."""
    if service is None:
        return
    for session in sessions:
        try:
            await service.aclose_session(session)
        except Exception:  # the fork already failed: that error is the one to raise
            pass


def _release_session(executor: PythonExecutorService | ShellService, session_id: str) -> None:
    """Schedule the end of a dropped episode's session on the executor's loop.

    Runs wherever the garbage collector does (possibly on that loop), so it
    only schedules and never waits.
    """
    loop = _portal.started_loop()
    if loop is not None:  # no loop, no session was ever started
        asyncio.run_coroutine_threadsafe(executor.aclose_session(session_id), loop)


def _resolve_shell(registry: ToolRegistry) -> ShellService | None:
    """The shell service of the tools' shell tools; never two services."""
    services = {
        id(t.shell): t.shell
        for t in registry
        if isinstance(t, ShellTool) or (isinstance(t, PythonTool) and t.shell is not None)
    }
    if len(services) > 1:
        raise UserError(
            "the tools include shell tools (or python_tool(shell=...)) on different "
            "ShellServices; build them all on one service"
        )
    return next(iter(services.values()), None)


def _conversation(prompt: Prompt, system_prompt: str | None) -> list[Message]:
    if prompt is not None and not isinstance(prompt, str):
        return [dict(m) for m in prompt]
    messages: list[Message] = []
    if system_prompt:
        messages.append({"role": "system", "content": system_prompt})
    if prompt is not None:
        messages.append({"role": "user", "content": prompt})
    return messages


def resolve_python(
    registry: ToolRegistry, python: PythonExecutorService | None
) -> PythonExecutorService | None:
    """``python``, else the executor of the tools' ``python_tool``; never two executors."""
    executors = {
        id(t.executor): t.executor
        for t in registry
        if isinstance(t, PythonTool) and t.episode_sessions
    }
    if python is not None:
        others = [e for key, e in executors.items() if key != id(python)]
        if others:
            raise UserError(
                "a python_tool among the tools runs on another executor than python=; "
                "build it with python_tool(<the same executor>)"
            )
        return python
    if len(executors) > 1:
        raise UserError(
            "the tools include python_tools on different executors; pass python= to choose"
        )
    return next(iter(executors.values()), None)
