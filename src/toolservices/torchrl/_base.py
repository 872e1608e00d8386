"""The transform all tool transforms share: read the turn, run, write back.

A step reads the last assistant message of every batch item, lets the
subclass run the tool calls of the whole batch at once (our transforms send
them through the dispatcher, so items run concurrently), appends the results
as ``tool`` messages padded with ``<none>``, writes per-item metrics under
:data:`METRICS_KEY` and, with ``max_failed_turns``, ends the episodes of items
whose calls kept failing. Nothing a tool or a model does raises out of
``env.step``.

Each batch item is an :class:`~toolservices.env.Episode` (made fresh when the
item is reset): turns, the failure streak and the ``_state`` the tools get are
counted there, as for every other layer of the library. The conversation
itself stays in TorchRL's ``History``.

TorchRL-style subclasses that only implement
``_process_batch_item(content, index) -> list[str] | None`` keep working: that
hook is run item by item, as TorchRL does.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from tensordict import NonTensorStack, TensorDict, TensorDictBase
from torchrl.data import Composite, NonTensor, Unbounded
from torchrl.envs.transforms import Transform

from toolservices._portal import run_sync
from toolservices.dispatch import ItemResult, StepMetrics
from toolservices.env import EpisodeHook, check_hook
from toolservices.env.episode import Episode, aclose_all, afinalize_all
from toolservices.errors import UserError
from toolservices.tools import ToolRegistry
from toolservices.torchrl._history import ToolMessage, append_tool_messages

__all__ = ["END_REASON_FAILURES", "METRICS_KEY", "ItemOutput", "ToolTransformBase"]

#: Where every tool transform writes its per-item metrics in the tensordict.
METRICS_KEY = "tool_metrics"
#: ``(name, dtype)`` of the numeric entries under :data:`METRICS_KEY`.
_NUMERIC = (
    ("calls", torch.int64),
    ("failed_calls", torch.int64),
    ("parse_errors", torch.int64),
    ("timeouts", torch.int64),
    ("tool_time", torch.float32),
    ("failed_turns", torch.int64),
)
#: The ``end_reason`` written when ``max_failed_turns`` ends an episode.
END_REASON_FAILURES = "too_many_failures"


@dataclass(kw_only=True)
class ItemOutput:
    """What one batch item produced in one step."""

    messages: list[ToolMessage] = field(default_factory=list)
    metrics: StepMetrics = field(default_factory=StepMetrics)


class ToolTransformBase(Transform):
    """Base class of the tool transforms (TorchRL's ``ToolTransformBase`` API).

    Subclasses implement either :meth:`_run_batch` (the whole batch at once)
    or TorchRL's per-item hook :meth:`_process_batch_item`. Options are
    keyword-only: ``max_failed_turns`` ends an item's episode (``done`` and
    ``terminated`` set, ``end_reason`` recorded) after that many consecutive
    turns whose calls all failed or were malformed; ``metrics_key`` names the
    metrics entry (``None`` writes none); ``record_call_ids`` stores the call
    each tool message answers in its ``tool_calls`` field (see
    :mod:`toolservices.torchrl._history` for why it is off by default).

    ``setup``/``finalize``/``keep_sessions`` (the dispatching transforms):
    episode hooks (see :class:`~toolservices.Episode`). Setup runs before an
    item's first turn (``episode.context["batch_index"]`` says which item);
    finalize when the item's episode is replaced by a reset or the
    transform is closed (:meth:`finalize_items` runs it earlier), its value
    in :attr:`outcomes` (per batch item, the last finished episode's).
    """

    #: Role of the appended messages (TorchRL's attribute name).
    tool_role: str = "tool"

    def __init__(
        self,
        *,
        max_failed_turns: int | None = None,
        metrics_key: str | None = METRICS_KEY,
        record_call_ids: bool = False,
        setup: EpisodeHook | None = None,
        finalize: EpisodeHook | None = None,
        keep_sessions: bool = False,
    ) -> None:
        super().__init__()
        check_hook("setup", setup)
        check_hook("finalize", finalize)
        self._hooks: dict[str, Any] = {
            "setup": setup,
            "finalize": finalize,
            "keep_sessions": keep_sessions,
        }
        #: ``finalize``'s value per batch item (its last ended episode's), and its errors.
        self.outcomes: list[Any] = []
        self.errors: list[str | None] = []
        self.record_call_ids = record_call_ids
        if max_failed_turns is not None and max_failed_turns < 1:
            raise UserError(f"max_failed_turns must be at least 1 or None, got {max_failed_turns}")
        self.max_failed_turns = max_failed_turns
        self.metrics_key = metrics_key
        #: Identifies this transform's environment in executor session ids.
        self.env_key = uuid.uuid4().hex[:12]
        #: One episode per batch item (turns, failure streak, ``_state``).
        self._episodes: list[Episode] = []

    # -- hooks for subclasses ----------------------------------------------------------

    def _run_batch(self, texts: Sequence[str | None]) -> list[ItemOutput]:
        """Run the calls of every item; ``texts[i]`` is None for items to skip.

        The default runs TorchRL's per-item hook, one item after the other,
        and counts each turn on the item's episode.
        """
        outputs = []
        for i, text in enumerate(texts):
            results = None if text is None else self._process_batch_item(text, i)
            messages = [ToolMessage(self._format_result(r)) for r in results or ()]
            output = ItemOutput(messages=messages, metrics=StepMetrics(calls=len(messages)))
            if text is not None:
                self._episodes[i].record_turn(ItemResult(metrics=output.metrics))
            outputs.append(output)
        return outputs

    def _new_episode(self, index: int) -> Episode:
        """A fresh episode for batch item ``index``; dispatching subclasses give it tools."""
        return Episode(_NO_TOOLS, parser=_no_calls, **self._episode_options(index))

    def _episode_options(self, index: int) -> dict[str, Any]:
        """What every item's episode shares: TorchRL's ``ChatEnv`` decides when it ends
        (no turn limit, an answer does not end it; ``max_failed_turns`` is applied here)."""
        return {
            "max_turns": None,
            "end_on_answer": False,
            "context": {"batch_index": index, "session_id": self.session_id(index)},
            **self._hooks,
        }

    def _process_batch_item(self, content: str, index: int) -> list[str] | None:
        """TorchRL's per-item hook: result strings for one response, or None."""
        raise NotImplementedError(
            f"{type(self).__name__} must implement _run_batch() or _process_batch_item()"
        )

    def _format_result(self, result: str) -> str:
        """TorchRL's per-result formatting hook (identity by default)."""
        return result

    def _end_sessions(self, indices: Sequence[int]) -> None:
        """Forget per-item state (interpreters, sessions) of reset items."""

    def session_id(self, index: int) -> str:
        """The executor session of batch item ``index`` in this environment."""
        return f"{self.env_key}:{index}"

    # -- TorchRL plumbing ----------------------------------------------------------------

    def _step(self, tensordict: TensorDictBase, next_tensordict: TensorDictBase) -> TensorDictBase:
        if next_tensordict.batch_dims == 1:
            return self._process(next_tensordict)
        # a multi-dimensional batch: work on the items in a row, then fold back
        shape = next_tensordict.batch_size
        flat = self._process(next_tensordict.reshape(-1))
        prompt = flat.get(("history", "prompt"))
        next_tensordict.set(("history", "prompt"), prompt.reshape(*shape, prompt.shape[-1]))
        keys = ["done", "terminated"] + ([self.metrics_key] if self.metrics_key else [])
        for key in keys:
            value = flat.get(key, None)
            if value is not None:
                next_tensordict.set(key, value.reshape(*shape, *value.shape[1:]))
        return next_tensordict

    def inv(self, tensordict: TensorDictBase) -> TensorDictBase:
        """The step input for the env: a new container sharing the entries.

        TorchRL's default clones the input so that inverse transforms cannot
        change the caller's tensordict; with no inverse keys there is nothing
        to protect beyond the top-level container (``TransformedEnv`` pops
        ``_step`` from it), and the clone of a batched History costs
        milliseconds per step.
        """
        if self.in_keys_inv:
            return super().inv(tensordict)
        return tensordict.select(*tensordict.keys(), strict=False)

    def _reset(
        self, tensordict: TensorDictBase, tensordict_reset: TensorDictBase
    ) -> TensorDictBase:
        size = tensordict_reset.numel()
        mask = tensordict.get("_reset", None) if tensordict is not None else None
        if mask is None:
            indices = list(range(size))
        else:
            indices = torch.as_tensor(mask).reshape(-1).nonzero().view(-1).tolist()
        self._grow(size)
        self._end_episodes([self._episodes[i] for i in indices])
        for i in indices:
            self._episodes[i] = self._new_episode(i)
        self._end_sessions(indices)
        if self.metrics_key is not None:
            tensordict_reset.set(
                self.metrics_key, self._metrics_td([ItemOutput()] * size, tensordict_reset)
            )
        return tensordict_reset

    def transform_observation_spec(self, observation_spec: Composite) -> Composite:
        if self.metrics_key is None:
            return observation_spec
        shape = observation_spec.shape
        entries: dict[str, Any] = {
            name: Unbounded(shape=shape, dtype=dtype, device=observation_spec.device)
            for name, dtype in _NUMERIC
        }
        entries["end_reason"] = NonTensor(shape=shape, example_data="", device=None)
        observation_spec[self.metrics_key] = Composite(entries, shape=shape)
        return observation_spec

    # -- the step --------------------------------------------------------------------------

    def _process(self, next_tensordict: TensorDictBase) -> TensorDictBase:
        history = self._prompt_history(next_tensordict)
        size = next_tensordict.shape[0]
        self._grow(size)
        base = self.parent.base_env
        policy_role = getattr(base, "policy_role", None) or "assistant"
        stop_roles = {
            policy_role,
            getattr(base, "user_role", "user"),
            getattr(base, "system_role", "system"),
        }
        texts = _this_turn(history, size, policy_role, stop_roles)
        outputs = self._run_batch(texts)
        extended = append_tool_messages(
            history,
            [o.messages for o in outputs],
            role=self.tool_role,
            record_call_ids=self.record_call_ids,
        )
        if extended is not None:
            next_tensordict.set(("history", "prompt"), extended)
        self._finish(next_tensordict, outputs)
        return next_tensordict

    def _prompt_history(self, next_tensordict: TensorDictBase) -> Any:
        parent = self.parent
        base = getattr(parent, "base_env", None)
        if base is None or getattr(base, "input_mode", None) != "history":
            raise UserError(
                f"{type(self).__name__} must be used with a ChatEnv in history mode "
                "(ChatEnv(input_mode='history'), the default)"
            )
        return next_tensordict["history"].prompt

    def _finish(self, next_tensordict: TensorDictBase, outputs: list[ItemOutput]) -> None:
        reasons = [""] * len(outputs)
        limit = self.max_failed_turns
        if limit is not None:
            for i in range(len(outputs)):
                if self._episodes[i].failed_streak >= limit:
                    reasons[i] = END_REASON_FAILURES
        ended = [bool(r) for r in reasons]
        if any(ended):
            flags = torch.tensor(ended, dtype=torch.bool)
            for key in ("done", "terminated"):
                current = next_tensordict.get(key, None)
                if current is None:
                    current = torch.zeros((len(outputs), 1), dtype=torch.bool)
                next_tensordict.set(key, current | flags.view(current.shape))
        if self.metrics_key is not None:
            self._write_metrics(next_tensordict, outputs, reasons)

    def _write_metrics(
        self, next_tensordict: TensorDictBase, outputs: list[ItemOutput], reasons: list[str]
    ) -> None:
        assert self.metrics_key is not None
        mine = self._metrics_td(outputs, next_tensordict, reasons)
        previous = next_tensordict.get(self.metrics_key, None)
        if previous is not None:  # another tool transform of the same env wrote first
            for name, _ in _NUMERIC:
                mine.set(name, mine.get(name) + previous.get(name))
            before = previous.get("end_reason").tolist()
            mine.set(
                "end_reason",
                NonTensorStack(*[b or r for b, r in zip(before, reasons, strict=True)]),
            )
        next_tensordict.set(self.metrics_key, mine)

    def _metrics_td(
        self,
        outputs: Sequence[ItemOutput],
        like: TensorDictBase,
        reasons: Sequence[str] | None = None,
    ) -> TensorDict:
        n = len(outputs)
        values: dict[str, Any] = {}
        for name, dtype in _NUMERIC:
            if name == "failed_turns":
                column: list[float] = [float(self._episodes[i].failed_streak) for i in range(n)]
            else:
                column = [float(getattr(o.metrics, name)) for o in outputs]
            values[name] = torch.tensor(column, dtype=dtype, device=like.device)
        values["end_reason"] = NonTensorStack(*(reasons or [""] * n))
        flat = TensorDict(values, batch_size=(n,), device=like.device)
        return flat if like.batch_dims == 1 else flat.reshape(like.batch_size)

    def _grow(self, size: int) -> None:
        while len(self._episodes) < size:
            self._episodes.append(self._new_episode(len(self._episodes)))

    def clone(self) -> ToolTransformBase:
        """A copy for another environment: same tools, its own sessions and counters."""
        twin: ToolTransformBase = super().clone()
        twin.env_key = uuid.uuid4().hex[:12]
        twin._episodes = []
        return twin

    def finalize_items(self) -> list[Any]:
        """Run ``finalize`` for every item's current episode now; :attr:`outcomes`."""
        self._end_episodes(self._episodes, close=False)
        return self.outcomes

    def _end_episodes(self, episodes: Sequence[Episode], *, close: bool = True) -> None:
        """Finalize (and close) the episodes that have a finalize hook; record the outcomes."""
        ending = [e for e in episodes if not e.closed and e.finalize is not None]
        if ending:
            run_sync(_end_all, ending, close)
        for episode in episodes:
            index = episode.context.get("batch_index")
            if isinstance(index, int) and episode.finalize is not None and episode.finalized:
                grow = index + 1 - len(self.outcomes)
                self.outcomes += [None] * grow
                self.errors += [None] * grow
                self.outcomes[index], self.errors[index] = episode.outcome, episode.error

    def close(self) -> None:
        """Release what the transform holds: finalize and close the items' episodes."""
        self._end_episodes(self._episodes)


#: The episodes of per-item hook transforms run no tools themselves.
_NO_TOOLS = ToolRegistry()


def _no_calls(response: Any) -> Any:
    """The parser of hook-only episodes (they never parse: the hook does)."""
    from toolservices.parsing.base import ParseResult

    return ParseResult(text=response if isinstance(response, str) else "")


def _column(values: Any, size: int) -> list[Any]:
    """One message field of a batch (``history[..., k].role``) as a list."""
    if isinstance(values, str) or not hasattr(values, "__len__"):
        return [values] * size
    column = list(values)
    return column if len(column) == size else [values] * size


def _this_turn(history: Any, size: int, policy_role: str, stop_roles: set[str]) -> list[str | None]:
    """Each item's message from the policy in this step, or None.

    That is the last message, or the last one before the messages that tool
    transforms earlier in the stack appended in this step (any role other
    than the policy's, the user's and the system's). Only the last few
    messages are read, not the whole history.
    """
    length = history.shape[-1]
    texts: list[str | None] = [None] * size
    pending = set(range(size))
    k = 1
    while pending and k <= length:
        last = history[..., -k]
        roles, contents = _column(last.role, size), _column(last.content, size)
        for i in list(pending):
            if roles[i] in stop_roles:
                pending.discard(i)
                if roles[i] == policy_role and isinstance(contents[i], str):
                    texts[i] = contents[i]
        k += 1
    return texts


async def _end_all(episodes: Sequence[Episode], close: bool) -> None:
    if close:
        await aclose_all(episodes)  # each runs its finalize first
    else:
        await afinalize_all(episodes)
