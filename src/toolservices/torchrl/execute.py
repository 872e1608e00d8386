"""``ExecuteToolsInOrder`` and ``SimpleToolTransform`` on the core dispatcher."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal

import anyio

from toolservices._portal import run_sync
from toolservices.dispatch import CallResult, Dispatcher, ItemResult, render_simple
from toolservices.env import EpisodeHook
from toolservices.env.episode import Episode, on_dispatcher, render_messages
from toolservices.errors import UserError
from toolservices.parsing import as_parser
from toolservices.parsing.base import ParseResult, ToolCall
from toolservices.tools import ToolRegistry
from toolservices.torchrl._base import METRICS_KEY, ItemOutput, ToolTransformBase
from toolservices.torchrl._calls import ParserLike, resolve_simple_parser, tools_from_mapping
from toolservices.torchrl._history import ToolMessage

__all__ = ["DispatchingTransform", "ExecuteToolsInOrder", "SimpleToolTransform"]

ResultFormat = Literal["tool_results", "openai"]


class DispatchingTransform(ToolTransformBase):
    """Run every item's turn on its :class:`~toolservices.env.Episode`.

    The episodes share one :class:`Dispatcher` (one concurrency bound), so
    items run concurrently (blocking tools in worker threads), the calls of
    one item in their order of appearance. Subclasses choose the messages.
    """

    def __init__(
        self,
        *,
        registry: ToolRegistry,
        parser: Callable[[str], ParseResult],
        timeout: float | None,
        max_concurrency: int,
        stop_on_error: bool,
        pass_state: bool,
        max_failed_turns: int | None,
        metrics_key: str | None,
        record_call_ids: bool,
        hooks: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(
            max_failed_turns=max_failed_turns,
            metrics_key=metrics_key,
            record_call_ids=record_call_ids,
            **(hooks or {}),
        )
        self.registry = registry
        self.parser = parser
        self.dispatcher = Dispatcher(
            registry,
            max_concurrency=max_concurrency,
            timeout=timeout,
            stop_on_error=stop_on_error,
            pass_state=pass_state,
        )

    @property
    def tool_specs(self) -> list[dict[str, Any]]:
        """OpenAI-style specs of the tools, for the chat template's ``tools=``."""
        return self.registry.openai_specs()

    def _new_episode(self, index: int) -> Episode:
        return Episode(
            self.registry,
            parser=self.parser,
            **on_dispatcher(self.dispatcher),
            **self._episode_options(index),
        )

    def _run_batch(self, texts: Sequence[str | None]) -> list[ItemOutput]:
        return run_sync(self._arun_batch, texts)

    async def _arun_batch(self, texts: Sequence[str | None]) -> list[ItemOutput]:
        outputs = [ItemOutput() for _ in texts]

        async def one(i: int, text: str) -> None:
            outcome = await self._episodes[i].arun_turn(text)
            if outcome.results:
                outputs[i] = ItemOutput(messages=self._messages(outcome), metrics=outcome.metrics)

        async with anyio.create_task_group() as tg:
            for i, text in enumerate(texts):
                if text is not None:
                    tg.start_soon(one, i, text)
        return outputs

    def _messages(self, outcome: ItemResult) -> list[ToolMessage]:
        raise NotImplementedError


def _call_of(outcome: ItemResult, result: CallResult) -> ToolCall | None:
    """The call ``result`` answers, carrying the result's id (the dispatcher names calls)."""
    calls = outcome.parse.calls if outcome.parse is not None else []
    if result.error_kind == "parse_error" or result.index >= len(calls):
        return None
    call = calls[result.index]
    return call if call.id == result.call_id else dataclasses.replace(call, id=result.call_id)


class ExecuteToolsInOrder(DispatchingTransform):
    """Run the calls of each item's last assistant message, in order of appearance.

    Same arguments as TorchRL's transform (``registry``, ``parser``,
    ``stop_on_error``, ``pass_state_to_tools``), plus keyword-only options:
    ``parser`` may also be a family name (``"hermes"``, ``"qwen3_coder"``, ...);
    ``result_format="tool_results"`` appends one ``<tool_results>`` message per
    item (TorchRL's text), ``"openai"`` one message per call with its call id;
    ``timeout`` and ``max_concurrency`` go to the dispatcher.

    ``_state`` (with ``batch_index``, ``turn``, ``call_index``,
    ``session_id`` and ``episode_id``: each item is an
    :class:`~toolservices.env.Episode`) is given only to tools that accept it.
    """

    def __init__(
        self,
        registry: ToolRegistry | Sequence[Any],
        parser: ParserLike = "xml_block",
        stop_on_error: bool = False,
        pass_state_to_tools: bool = True,
        *,
        result_format: ResultFormat = "tool_results",
        timeout: float | None = 10.0,
        max_concurrency: int = 64,
        max_failed_turns: int | None = None,
        metrics_key: str | None = METRICS_KEY,
        record_call_ids: bool = False,
        setup: EpisodeHook | None = None,
        finalize: EpisodeHook | None = None,
        keep_sessions: bool = False,
    ) -> None:
        if result_format not in ("tool_results", "openai"):
            raise UserError(
                f"Unknown result_format {result_format!r}; valid: 'tool_results', 'openai'"
            )
        registry = registry if isinstance(registry, ToolRegistry) else ToolRegistry(registry)
        super().__init__(
            registry=registry,
            parser=as_parser(parser, tools=registry),
            timeout=timeout,
            max_concurrency=max_concurrency,
            stop_on_error=stop_on_error,
            pass_state=pass_state_to_tools,
            max_failed_turns=max_failed_turns,
            metrics_key=metrics_key,
            record_call_ids=record_call_ids,
            hooks={"setup": setup, "finalize": finalize, "keep_sessions": keep_sessions},
        )
        self.stop_on_error = stop_on_error
        self.pass_state_to_tools = pass_state_to_tools
        self.result_format: ResultFormat = result_format

    def _messages(self, outcome: ItemResult) -> list[ToolMessage]:
        results = outcome.results
        rendered = render_messages(results, self.result_format)
        if self.result_format == "openai":  # one message per result
            return [
                ToolMessage(m["content"], _call_of(outcome, r))
                for m, r in zip(rendered, results, strict=True)
            ]
        only = _call_of(outcome, results[0]) if len(results) == 1 else None
        return [ToolMessage(m["content"], only) for m in rendered]


class SimpleToolTransform(DispatchingTransform):
    """Tools from a ``name -> callable`` dict, TorchRL's simple syntax by default.

    ``<tool>NAME\\n{json}</tool>``; ``tool_call_pattern`` (a regex capturing
    name and JSON) or ``parser`` (an object or a family name) replace it. One
    message per call: ``Tool NAME executed successfully:\\n<result>`` or
    ``Tool NAME failed:\\n<error>``, where ``<error>`` is the tool's own.
    ``tool_schemas`` (or typed signatures) feed :attr:`tool_specs`; as in
    TorchRL a tool gets the model's arguments as they are, unless
    ``validate_arguments=True`` checks them against the schemas first.
    ``timeout`` is enforced.
    """

    def __init__(
        self,
        tools: Mapping[str, Callable[..., Any]],
        tool_schemas: Mapping[str, Mapping[str, Any]] | None = None,
        parser: ParserLike | None = None,
        tool_call_pattern: str | None = None,
        tool_name: str = "tool",
        timeout: float = 10.0,
        *,
        validate_arguments: bool = False,
        pass_state_to_tools: bool = False,
        max_concurrency: int = 64,
        max_failed_turns: int | None = None,
        metrics_key: str | None = METRICS_KEY,
        record_call_ids: bool = False,
        setup: EpisodeHook | None = None,
        finalize: EpisodeHook | None = None,
        keep_sessions: bool = False,
    ) -> None:
        registry = tools_from_mapping(tools, tool_schemas, validate=validate_arguments)
        super().__init__(
            registry=registry,
            parser=resolve_simple_parser(parser, tool_call_pattern, tools=registry),
            timeout=timeout,
            max_concurrency=max_concurrency,
            stop_on_error=False,
            pass_state=pass_state_to_tools,
            max_failed_turns=max_failed_turns,
            metrics_key=metrics_key,
            record_call_ids=record_call_ids,
            hooks={"setup": setup, "finalize": finalize, "keep_sessions": keep_sessions},
        )
        self.tools = dict(tools)
        self.tool_schemas = dict(tool_schemas or {})
        self.tool_call_pattern = tool_call_pattern
        self.tool_role = tool_name
        self.timeout = timeout
        self.validate_arguments = validate_arguments

    def _messages(self, outcome: ItemResult) -> list[ToolMessage]:
        return [
            ToolMessage(simple_result_text(r, self.registry), _call_of(outcome, r))
            for r in outcome.results
        ]


def simple_result_text(result: CallResult, registry: ToolRegistry, *, name: str = "") -> str:
    """TorchRL's ``Tool NAME executed successfully:`` / ``Tool NAME failed:`` text
    (the ``simple`` format of :mod:`toolservices.dispatch.render`)."""
    return render_simple(result, available=registry.names(), name=name)
