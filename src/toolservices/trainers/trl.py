"""Hugging Face TRL: an ``environment_factory`` class for ``GRPOTrainer``.

TRL (1.x) builds one environment instance per concurrent rollout, calls
``reset(**row)`` before each rollout, exposes every public method as a tool
(schema from its type hints and docstring) and calls ``get_reward()`` once
per finished rollout when the class defines it. :func:`trl_environment`
writes such a class for any toolservices tools::

    Env = trl_environment([python_tool(executor), add], python=executor)
    trainer = GRPOTrainer(model=..., environment_factory=Env, ...)
    trainer.train()
    Env.close_all()

Each instance holds one :class:`~toolservices.Episode` (and so one Python
session) at a time: ``reset`` ends the previous rollout's episode and starts
a fresh one, so nothing carries over between rollouts even though TRL reuses
instances. ``close_all()`` ends the episodes still open after training.

This module does not import TRL: the class only follows its conventions.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, ClassVar

from toolservices import _portal
from toolservices.errors import UserError
from toolservices.trainers._calls import adapter_spec, outcome_score, run_call
from toolservices.trainers._signature import make_method

if TYPE_CHECKING:
    from toolservices.env import Episode, EpisodeHook, EpisodeSpec
    from toolservices.python import PythonExecutorService
    from toolservices.tools import ToolRegistry

__all__ = ["TRLEnvironment", "trl_environment"]

#: Names TRL gives a meaning of its own (or hides): no tool may take them.
_RESERVED = frozenset({"reset", "get_reward", "close_all", "episode"})


class TRLEnvironment:
    """Base of the classes :func:`trl_environment` builds (one per configuration).

    Only the tool methods are public functions: TRL turns every public
    function of the class into a tool, so the helpers here are private,
    properties or class methods.
    """

    _spec: ClassVar[EpisodeSpec]
    _reward: ClassVar[Callable[[Episode], float] | None] = None
    _instances: ClassVar[weakref.WeakSet[TRLEnvironment]]
    _lock: ClassVar[threading.Lock]

    def __init__(self) -> None:
        self._episode: Episode | None = None
        with self._lock:
            self._instances.add(self)

    def reset(self, **row: Any) -> str | None:
        """Start a new rollout: end the previous episode, open a fresh one.

        The dataset row becomes the episode's ``state``, which tools that take
        ``_state`` receive (with ``episode_id`` and ``python_session``), and
        the ``setup`` hook runs now (a failure ends the episode: its tools
        then answer that the environment could not be set up).
        """
        self._end_episode()
        episode = self._episode = self._spec.new_episode(state=row)
        if self._spec.setup is not None or self._spec.finalize is not None:
            # started now, so finalize scores a rollout whose model never called a tool too
            _portal.run_sync(episode.astart)
        return None

    @property
    def episode(self) -> Episode:
        """The current rollout's episode (its messages, metrics and state)."""
        if self._episode is None:
            self._episode = self._spec.new_episode()
        return self._episode

    def _call(self, name: str, arguments: dict[str, Any]) -> str:
        return _portal.run_sync(run_call, self.episode, name, arguments)

    def _end_episode(self) -> None:
        episode, self._episode = self._episode, None
        if episode is not None:
            _portal.run_sync(episode.aclose)

    @classmethod
    def close_all(cls) -> None:
        """End every instance's open episode (and Python session). Call after training."""
        with cls._lock:
            instances = list(cls._instances)
        for instance in instances:
            instance._end_episode()


def _get_reward(self: TRLEnvironment) -> float:
    """The rollout's reward: ``finalize`` runs first (once), then ``reward(episode)``,
    or, without ``reward``, ``finalize``'s return value: a number, or a mapping's
    numeric ``"score"`` as verl's reward functions return (0.0 when it failed)."""
    episode = self.episode
    if self._spec.finalize is not None:
        _portal.run_sync(episode.afinalize)
    reward = type(self)._reward
    if reward is not None:
        return float(reward(episode))
    if episode.outcome is None:
        return 0.0
    score = outcome_score(episode.outcome)
    if score is None:
        raise UserError(
            f"finalize returned {type(episode.outcome).__name__} {episode.outcome!r:.80}, which "
            "is no reward: return a number or a mapping with a numeric 'score', or pass "
            "reward=... to trl_environment to compute the reward from the episode"
        )
    return score


def trl_environment(
    tools: ToolRegistry | Iterable[Any],
    *,
    python: PythonExecutorService | None = None,
    timeout: float | None = 10.0,
    reward: Callable[[Episode], float] | None = None,
    max_calls: int | None = None,
    name: str = "ToolEnvironment",
    setup: EpisodeHook | None = None,
    finalize: EpisodeHook | None = None,
) -> type[TRLEnvironment]:
    """A class to pass as ``GRPOTrainer(environment_factory=...)``.

    * ``tools``: toolservices tools (``@tool`` functions, ``Tool`` objects,
      services, ``python_tool(executor)``); each becomes one typed, documented
      method that TRL offers the model.
    * ``python``: the executor whose sessions the episodes use (defaults to
      the executor of a ``python_tool`` among ``tools``).
    * ``timeout``: seconds per tool call (a tool's own limit wins; the
      ``python`` tool's limit is the executor's).
    * ``reward``: ``reward(episode) -> float``; when given the class has
      ``get_reward``, which TRL calls once per finished rollout.
    * ``max_calls``: calls per rollout before the tools answer that the episode
      has ended (``None``: TRL's ``max_tool_calling_iterations`` is the bound).
    * ``setup``/``finalize``: episode hooks (see :class:`~toolservices.Episode`).
      ``setup`` runs in ``reset(**row)`` with the row as the episode's
      ``state`` (seed the repository); ``finalize`` runs in ``get_reward``
      on the final workspace (hidden tests) and its return value is the
      reward unless ``reward`` is given (which then reads ``episode.outcome``).
      The class has ``get_reward`` when either ``reward`` or ``finalize`` is given.
    """
    spec = adapter_spec(
        tools, python=python, timeout=timeout, max_turns=max_calls, setup=setup, finalize=finalize
    )
    namespace: dict[str, Any] = {
        "_spec": spec,
        "_reward": staticmethod(reward) if reward is not None else None,
        "_instances": weakref.WeakSet(),
        "_lock": threading.Lock(),
        "__module__": __name__,
        "__doc__": f"TRL environment with tools: {', '.join(spec.registry.names())}.",
    }
    for tool in spec.registry:
        if tool.name in _RESERVED or tool.name.startswith("_"):
            raise UserError(
                f"tool name {tool.name!r} cannot be a TRL environment method "
                f"(reserved: {sorted(_RESERVED)}; TRL hides names starting with '_')"
            )
        namespace[tool.name] = make_method(tool, TRLEnvironment._call)
    if reward is not None or finalize is not None:
        namespace["get_reward"] = _get_reward
    return type(name, (TRLEnvironment,), namespace)
