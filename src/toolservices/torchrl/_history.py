"""Reading the last assistant turn from, and appending tool messages to, a History.

``torchrl.data.llm.History`` is a tensorclass with a fixed set of fields
(``role``, ``content``, ``is_complete``, ``tool_calls``, ``tool_responses``),
so a tool message cannot carry a ``tool_call_id`` field of its own. On request
(``record_call_ids=True``) we record the call a message answers in its
``tool_calls`` entry instead, in the OpenAI shape
``[{"id", "type": "function", "function": {"name", "arguments"}}]``;
:func:`history_to_messages` turns that back into ``tool_call_id`` for chat
templates and APIs that want it.

It is off by default because a message with a field the others lack makes
TorchRL's dense ``History.extend(..., inplace=False)`` (what
``TransformersWrapper`` does to build ``history.full``) fail with "The sets
of keys in the tensordicts to stack are exclusive"; per-item appends (the
vLLM wrapper's path) are unaffected.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from tensordict import lazy_stack
from torchrl.data.llm import History

from toolservices.parsing.base import ToolCall

__all__ = ["PAD_ROLE", "ToolMessage", "append_tool_messages", "history_to_messages"]

#: TorchRL's placeholder role; chat templates drop these entries.
PAD_ROLE = "<none>"


@dataclass(frozen=True)
class ToolMessage:
    """One message to append after the assistant turn of a batch item."""

    content: str
    #: The call this message answers, when it answers exactly one.
    call: ToolCall | None = None


def _call_entry(call: ToolCall) -> list[dict[str, Any]]:
    return [
        {
            "id": call.id,
            "type": "function",
            "function": {"name": call.tool, "arguments": json.dumps(call.args, default=str)},
        }
    ]


def _as_history(message: ToolMessage, role: str, with_call: bool) -> History:
    if message.call is None or not with_call:
        return History(role=role, content=message.content)
    return History(role=role, content=message.content, tool_calls=_call_entry(message.call))


def append_tool_messages(
    history: History,
    per_item: Sequence[Sequence[ToolMessage]],
    *,
    role: str,
    record_call_ids: bool = False,
) -> History | None:
    """``history`` (batch x time), extended in place with each item's messages.

    Items with fewer messages are padded with ``<none>`` entries so the batch
    stays rectangular. Returns ``None`` when no item has a message (the
    history is then left as it is, as TorchRL does).
    """
    width = max((len(m) for m in per_item), default=0)
    if width == 0:
        return None
    padding = History(role=PAD_ROLE, content="")
    rows = []
    for messages in per_item:
        row = [_as_history(m, role, record_call_ids) for m in messages]
        row.extend(padding for _ in range(width - len(row)))
        rows.append(lazy_stack(row))
    return history.extend(lazy_stack(rows), inplace=True, dim=-1)


def history_to_messages(history: History) -> list[Any]:
    """Chat dicts for ``history`` without padding, with ``tool_call_id`` restored.

    A 1-D history gives one conversation (a list of dicts); a batched one a
    list of conversations.
    """
    data = history.tolist()

    def convert(conversation: list[dict[str, Any]]) -> list[dict[str, Any]]:
        out = []
        for message in conversation:
            if message.get("role") == PAD_ROLE:
                continue
            message = {k: v for k, v in message.items() if v is not None and k != "is_complete"}
            calls = message.get("tool_calls")
            if message.get("role") != "assistant" and calls and len(calls) == 1:
                message.pop("tool_calls")
                message["tool_call_id"] = calls[0].get("id", "")
                message.setdefault("name", calls[0].get("function", {}).get("name", ""))
            out.append(message)
        return out

    if data and isinstance(data[0], dict):
        return convert(data)
    return [convert(c) for c in data]
