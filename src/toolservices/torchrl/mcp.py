"""``MCPToolTransform``: the tools of MCP servers, called from the model's turns.

The servers are connected once through :class:`toolservices.mcp.MCPToolset`
(one background loop, restarts with backoff, process groups shut down on
close); a server that cannot start raises at construction instead of being
skipped. Calls go through the core dispatcher, so items run concurrently.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Mapping
from typing import Any

from toolservices.dispatch import ItemResult
from toolservices.mcp import MCPToolset
from toolservices.parsing.base import ParseResult
from toolservices.tools import ToolRegistry
from toolservices.torchrl._base import METRICS_KEY
from toolservices.torchrl._calls import ParserLike, resolve_simple_parser, unchecked
from toolservices.torchrl._history import ToolMessage
from toolservices.torchrl.execute import DispatchingTransform, _call_of, simple_result_text

__all__ = ["MCPToolTransform"]


class MCPToolTransform(DispatchingTransform):
    """Run ``<tool>SERVER.TOOL\\n{json}</tool>`` calls on MCP servers.

    ``servers`` maps names to ``{"command", "args", "env"}`` (stdio),
    ``{"url", "headers"}`` (streamable HTTP) or the config objects of
    :mod:`toolservices.mcp`. A name without a server prefix means the first
    server, as in TorchRL. A failed call's ``<error>`` is the server's own
    answer: the model's arguments go to the server as they are (MCP servers
    validate their inputs), unless ``validate_arguments=True`` checks them
    against the tool's input schema here first. Keyword-only extras:
    ``toolset`` (share an already connected :class:`MCPToolset`; the
    transform then does not close it), ``parser`` (any family, e.g.
    ``"hermes"``), ``max_concurrency``, ``max_failed_turns``, ``metrics_key``.
    """

    def __init__(
        self,
        servers: Mapping[str, Any] | None = None,
        tool_call_pattern: str | None = None,
        tool_name: str = "tool",
        timeout: float = 10.0,
        *,
        toolset: MCPToolset | None = None,
        parser: ParserLike | None = None,
        validate_arguments: bool = False,
        max_concurrency: int = 64,
        max_failed_turns: int | None = None,
        metrics_key: str | None = METRICS_KEY,
        record_call_ids: bool = False,
    ) -> None:
        from toolservices.errors import UserError

        if (servers is None) == (toolset is None):
            raise UserError("MCPToolTransform needs exactly one of 'servers' and 'toolset'")
        owned = toolset is None
        if toolset is None:
            assert servers is not None
            toolset = MCPToolset(servers, timeout=timeout)
        toolset.connect()
        registry = ToolRegistry()
        for tool in toolset.tools():
            registry.register(tool if validate_arguments else unchecked(tool))
        resolved = resolve_simple_parser(parser, tool_call_pattern, tools=registry)
        default_server = next(iter(toolset.servers))
        super().__init__(
            registry=registry,
            parser=_DefaultServer(resolved, default_server, registry),
            timeout=timeout,
            max_concurrency=max_concurrency,
            stop_on_error=False,
            pass_state=False,
            max_failed_turns=max_failed_turns,
            metrics_key=metrics_key,
            record_call_ids=record_call_ids,
        )
        self.server_configs = dict(servers) if servers is not None else dict(toolset.servers)
        self.tool_call_pattern = tool_call_pattern
        self.tool_role = tool_name
        self.timeout = timeout
        self.toolset = toolset
        self.validate_arguments = validate_arguments
        self._finalizer = weakref.finalize(self, toolset.close if owned else _nothing)

    def clone(self) -> MCPToolTransform:
        """A copy for another environment that shares the servers (closing it keeps them)."""
        twin = super().clone()
        assert isinstance(twin, MCPToolTransform)
        twin._finalizer = weakref.finalize(twin, _nothing)
        return twin

    def close(self) -> None:
        """Shut the MCP servers down (unless the toolset was given by the caller)."""
        self._finalizer()

    def _messages(self, outcome: ItemResult) -> list[ToolMessage]:
        return [
            ToolMessage(simple_result_text(r, self.registry), _call_of(outcome, r))
            for r in outcome.results
        ]


def _nothing() -> None:
    """The finalizer of a transform that does not own its toolset."""


class _DefaultServer:
    """Gives calls without a ``server.`` prefix the first server, when it has that tool."""

    def __init__(
        self, parser: Callable[[str], ParseResult], server: str, registry: ToolRegistry
    ) -> None:
        self.parser = parser
        self.server = server
        self.registry = registry

    def __call__(self, text: str) -> ParseResult:
        result = self.parser(text)
        for call in result.calls:
            prefixed = f"{self.server}.{call.tool}"
            if "." not in call.tool and prefixed in self.registry:
                call.tool = prefixed
        return result
