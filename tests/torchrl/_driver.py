"""A real ``ChatEnv`` driven by scripted assistant turns, for the TorchRL tests.

Drive a real batched ``ChatEnv`` (history mode) with scripted assistant turns.

No model and no tokenizer: history mode needs neither. Each step appends one
assistant message per batch item, exactly as an LLM wrapper would fill
``("history", "full")`` and ``("history", "response")``, and the next step
starts from the prompt the env returned (``out["next"]``).

``ChatEnv`` 0.14.1 loses the history of every item on a partial reset (a
``_reset`` mask), so :meth:`ChatDriver.reset_items` rebuilds the prompts of the
items that were not reset from the driver's own copy; the transforms still see
the real mask through ``env.reset``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from tensordict import TensorDict, TensorDictBase, lazy_stack
from torchrl.data.llm import History
from torchrl.envs import Transform, TransformedEnv
from torchrl.envs.llm import ChatEnv
from torchrl.modules.llm.policies import ChatHistory


class ChatDriver:
    """A ``TransformedEnv(ChatEnv(batch_size=(n,)), transform)`` and its turns."""

    def __init__(
        self,
        transform: Transform | Sequence[Transform],
        batch_size: int,
        *,
        system_prompt: str | None = None,
    ) -> None:
        self.batch_size = batch_size
        base = ChatEnv(batch_size=(batch_size,), system_prompt=system_prompt)
        self.env = TransformedEnv(base)
        transforms = [transform] if isinstance(transform, Transform) else list(transform)
        for t in transforms:
            self.env.append_transform(t)
        self.td: TensorDictBase | None = None
        self.last: TensorDictBase | None = None

    # -- episode control ------------------------------------------------------------

    def reset(self, queries: Sequence[str] | None = None) -> TensorDictBase:
        queries = list(queries or [f"question {i}" for i in range(self.batch_size)])
        self.td = self.env.reset(TensorDict(query=queries, batch_size=(self.batch_size,)))
        return self.td

    def step(self, texts: Sequence[str]) -> TensorDictBase:
        """Append one assistant message per item, step, keep ``out["next"]``."""
        assert self.td is not None, "reset() first"
        assert len(texts) == self.batch_size
        history: ChatHistory = self.td["history"]
        response = lazy_stack(
            [History(role="assistant", content=text).unsqueeze(0) for text in texts]
        )
        history.full = history.prompt.extend(response, inplace=False, dim=-1)
        history.response = response
        self.td["history"] = history
        out = self.env.step(self.td)
        self.last = out["next"]
        self.td = out["next"].exclude("done", "terminated", "reward")
        return self.last

    def reset_items(self, mask: Sequence[bool], queries: Sequence[str] | None = None) -> None:
        """Reset the masked items through ``env.reset(_reset=mask)``.

        The other items keep their conversation (rebuilt here, see the module
        docstring); reset items start again from their query.
        """
        assert self.td is not None
        queries = list(queries or [f"again {i}" for i in range(self.batch_size)])
        before = self.conversations()
        request = TensorDict(
            {
                "_reset": torch.tensor(list(mask), dtype=torch.bool).view(self.batch_size, 1),
                "query": queries,
            },
            batch_size=(self.batch_size,),
        )
        self.env.reset(request)
        chats = [
            [{"role": "user", "content": queries[i]}] if mask[i] else before[i]
            for i in range(self.batch_size)
        ]
        self.td = TensorDict(
            history=ChatHistory(prompt=_rectangular(chats)), batch_size=(self.batch_size,)
        )

    # -- reading the conversation -------------------------------------------------------

    def conversations(self) -> list[list[dict[str, Any]]]:
        """Every item's prompt as chat dicts (padding entries included)."""
        assert self.td is not None
        return self.td["history"].prompt.tolist()

    def roles(self, i: int) -> list[str]:
        return [m["role"] for m in self.conversations()[i]]

    def contents(self, i: int) -> list[str]:
        return [m["content"] for m in self.conversations()[i]]

    def messages_after_last_assistant(self, i: int) -> list[dict[str, Any]]:
        """What the transforms appended to item ``i`` in the last step."""
        conv = self.conversations()[i]
        last = max(k for k, m in enumerate(conv) if m["role"] == "assistant")
        return conv[last + 1 :]

    def tool_texts(self, i: int) -> list[str]:
        """Contents of the real (non-padding) tool messages of the last step."""
        return [
            m["content"] for m in self.messages_after_last_assistant(i) if m["role"] != "<none>"
        ]

    def metric(self, name: str) -> list[float]:
        assert self.last is not None
        return self.last["tool_metrics", name].view(-1).tolist()

    def done(self) -> list[bool]:
        assert self.last is not None
        return self.last["done"].view(-1).tolist()


def _rectangular(chats: list[list[dict[str, Any]]]) -> History:
    """A batched History, padded with ``<none>`` entries to equal length."""
    length = max(len(c) for c in chats)
    padded = [c + [{"role": "<none>", "content": ""}] * (length - len(c)) for c in chats]
    return History.from_chats(padded)
