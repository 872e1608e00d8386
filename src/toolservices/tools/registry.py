"""A name -> tool mapping with the contract's errors and the chat-template specs."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

from toolservices.errors import ToolNotFoundError, UserError
from toolservices.tools.base import Tool, as_tool

__all__ = ["ToolRegistry"]


class ToolRegistry:
    """The tools a model may call, by name.

    Accepts :class:`Tool` objects, TorchRL-style services and plain typed
    functions. A second registration under the same name is a developer error
    unless ``replace=True``.
    """

    def __init__(self, services: Iterable[Any] = ()) -> None:
        self._tools: dict[str, Tool] = {}
        for service in services:
            self.register(service)

    def register(self, service: Any, *, replace: bool = False) -> Tool:
        """Add a tool and return it (wrapped as a :class:`Tool`)."""
        wrapped = as_tool(service)
        if wrapped.name in self._tools and not replace:
            raise UserError(
                f"A tool named '{wrapped.name}' is already registered; "
                "pass replace=True to replace it"
            )
        self._tools[wrapped.name] = wrapped
        return wrapped

    def unregister(self, name: str) -> None:
        """Remove a tool; unknown names raise like :meth:`get`."""
        self.get(name)
        del self._tools[name]

    def get(self, name: str) -> Tool:
        """The tool called ``name``; a ``KeyError`` naming the valid tools if none."""
        try:
            return self._tools[name]
        except KeyError:
            available = ", ".join(sorted(self._tools)) or "none"
            raise ToolNotFoundError(f"Unknown tool: {name}. Available tools: {available}") from None

    def __getitem__(self, name: str) -> Tool:
        return self.get(name)

    def __contains__(self, name: object) -> bool:
        return name in self._tools

    def __iter__(self) -> Iterator[Tool]:
        return iter(self._tools.values())

    def __len__(self) -> int:
        return len(self._tools)

    def names(self) -> list[str]:
        """Tool names in registration order."""
        return list(self._tools)

    def openai_specs(self) -> list[dict[str, Any]]:
        """OpenAI-style tool specs, as chat templates take them in ``tools=``."""
        return [t.openai_spec() for t in self._tools.values()]

    # Common alias in chat-template code.
    tool_specs = openai_specs

    def __repr__(self) -> str:
        return f"ToolRegistry({self.names()!r})"
