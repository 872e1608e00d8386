"""Run tool calls that a trainer has already parsed inside a toolservices Episode.

Trainers (TRL, verifiers, verl) parse the model's tool calls themselves and
hand over one call at a time as a name and arguments. Each adapter keeps one
:class:`~toolservices.Episode` per rollout, made from one
:class:`~toolservices.env.EpisodeSpec`; :func:`run_call` gives the episode
the call as it is (:meth:`~toolservices.Episode.astep_calls`: no text to
parse, no JSON in between), so the episode's timeout, ``_state`` (with its
own Python session), argument validation and error rendering apply exactly
as for text the library parsed itself. The episode orders concurrent calls
itself: nothing here keeps per-episode state.
"""

from __future__ import annotations

import importlib
import numbers
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from toolservices.env import Episode, EpisodeHook, EpisodeSpec
from toolservices.errors import UserError
from toolservices.parsing.base import ToolCall
from toolservices.tools import ToolRegistry

if TYPE_CHECKING:
    from toolservices.python import PythonExecutorService

__all__ = ["adapter_spec", "load_hook", "outcome_score", "run_call"]


def adapter_spec(
    tools: ToolRegistry | Iterable[Any],
    *,
    python: PythonExecutorService | None = None,
    timeout: float | None = 10.0,
    max_turns: int | None = None,
    setup: EpisodeHook | None = None,
    finalize: EpisodeHook | None = None,
) -> EpisodeSpec:
    """The spec of a trainer adapter's episodes, checked now (not at the first rollout).

    The trainer parsed the calls, so the episodes parse nothing
    (``parser=None``) and a turn without calls does not end them; one
    dispatcher (one concurrency bound) serves all of them.
    """
    spec = EpisodeSpec(
        tools,
        parser=None,
        python=python,
        timeout=timeout,
        max_turns=max_turns,
        end_on_answer=False,
        setup=setup,
        finalize=finalize,
    )
    if not len(spec.registry):
        raise UserError("an adapter needs at least one tool")
    return spec


async def run_call(
    episode: Episode,
    name: str,
    arguments: Mapping[str, Any],
    *,
    call_id: str | None = None,
) -> str:
    """Run one parsed call in ``episode`` and return the text the model reads.

    Nothing the model or a tool does raises: an unknown tool, invalid
    arguments, a failure or a timeout come back as the error text. A call on
    an episode that has ended (``max_turns``, closed) says so in the text as
    well. Calls made concurrently on one episode run one at a time, in order.
    """
    if episode.done:
        return _ended(episode, name)
    call = ToolCall(name, dict(arguments), id=call_id or "")
    try:
        replies = await episode.astep_calls([call])
    except UserError:
        if episode.done:  # it ended while this call waited for the one before
            return _ended(episode, name)
        raise
    if not replies and episode.reason == "setup_error":  # its setup failed before this call
        return _ended(episode, name)
    return "\n".join(str(reply.get("content", "")) for reply in replies)


def load_hook(name: str, ref: object) -> EpisodeHook | None:
    """The hook a trainer config names: ``"package.module:function"`` (or the callable itself)."""
    if ref is None or callable(ref):
        return ref
    if not isinstance(ref, str) or ":" not in ref:
        raise UserError(f"{name} must be 'package.module:function', got {ref!r}")
    module_name, _, attribute = ref.partition(":")
    try:
        obj: Any = importlib.import_module(module_name)
        for part in attribute.split("."):
            obj = getattr(obj, part)
    except (ImportError, AttributeError) as exc:
        raise UserError(f"{name} {ref!r} cannot be loaded: {exc}") from exc
    if not callable(obj):
        raise UserError(f"{name} {ref!r} is a {type(obj).__name__}, not a function")
    return obj  # type: ignore[no-any-return]


def outcome_score(outcome: object) -> float | None:
    """``finalize``'s value as a trainer's reward, or None when it is not one.

    A number (a bool counts) is the reward; so is a mapping's numeric
    ``"score"`` (the form verl's reward functions return, so a hook can
    return the score with its details). Anything else, None included, is
    no reward: the adapter keeps the value for the trainer's own reward code.
    """
    if isinstance(outcome, Mapping):
        outcome = outcome.get("score")
    if isinstance(outcome, numbers.Real):
        return float(outcome)
    return None


def _ended(episode: Episode, name: str) -> str:
    why = "the environment could not be set up" if episode.reason == "setup_error" else None
    return f"Error: the episode has ended ({why or episode.reason}); tool '{name}' was not run."
