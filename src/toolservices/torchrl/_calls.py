"""Parsers and tools as the transforms accept them, normalised once.

Users coming from TorchRL pass a parser object (ours or any callable that
returns a ``{"text", "calls"}`` mapping), a parser family name, or a regex;
and tools as a registry, a list or a ``name -> callable`` dict. Parsers go
through :func:`toolservices.parsing.as_parser` (the one normalisation every
``parser=`` shares); tools become a ``ToolRegistry``.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from toolservices.errors import ToolDefinitionError, UserError
from toolservices.parsing import ParserLike, as_parser
from toolservices.parsing.base import ParseResult
from toolservices.tools import STATE_PARAMETER, FunctionTool, Tool, ToolRegistry

__all__ = [
    "ParserLike",
    "resolve_registry",
    "resolve_simple_parser",
    "tools_from_mapping",
    "unchecked",
]


def resolve_simple_parser(
    parser: ParserLike, pattern: str | None, *, tools: Any
) -> Callable[[str], ParseResult]:
    """The ``<tool>`` transforms' rule: ``parser`` if given, else a regex
    ``pattern``, else the ``simple_tool`` family."""
    if parser is not None:
        return as_parser(parser, tools=tools)
    if pattern is not None:
        from toolservices.parsing import RegexParser

        return RegexParser(pattern, tools=tools)
    return as_parser("simple_tool", tools=tools)


def resolve_registry(tools: Any) -> ToolRegistry:
    """A :class:`ToolRegistry` from a registry, a ``name -> callable`` dict or a list."""
    if isinstance(tools, ToolRegistry):
        return tools
    if isinstance(tools, Mapping):
        return tools_from_mapping(tools)
    if isinstance(tools, Iterable) and not isinstance(tools, (str, bytes)):
        return ToolRegistry(tools)
    raise UserError(
        "tools must be a ToolRegistry, a dict of name -> callable or a list of tools, "
        f"got {type(tools).__name__}"
    )


def tools_from_mapping(
    tools: Mapping[str, Any],
    schemas: Mapping[str, Mapping[str, Any]] | None = None,
    *,
    validate: bool = True,
) -> ToolRegistry:
    """Tools named by the dict keys (TorchRL's ``SimpleToolTransform(tools=...)``).

    Typed functions get their schema from the signature; a schema in
    ``schemas`` (JSON Schema of the arguments, or a full OpenAI spec) replaces
    it. Schemas feed the chat-template specs; with ``validate`` they also
    check (and, for typed functions, convert) the arguments before the call.
    Without it every tool gets the model's arguments as they are, as in
    TorchRL, and answers bad ones itself.
    """
    registry = _registry_from_mapping(tools, schemas)
    if validate:
        return registry
    return ToolRegistry([unchecked(t) for t in registry])


def _registry_from_mapping(
    tools: Mapping[str, Any], schemas: Mapping[str, Mapping[str, Any]] | None
) -> ToolRegistry:
    registry = ToolRegistry()
    for name, fn in tools.items():
        if not callable(fn):
            raise UserError(f"tool '{name}' is not callable: {fn!r}")
        schema = _parameters(schemas.get(name)) if schemas else None
        if isinstance(fn, Tool):
            registry.register(fn if fn.name == name else _CallableTool(name, fn, schema))
        elif schema is None and (inspect.isfunction(fn) or inspect.ismethod(fn)):
            try:
                registry.register(FunctionTool(fn, name=name))
            except ToolDefinitionError:  # untyped or unusual: keep TorchRL's plain call
                registry.register(_CallableTool(name, fn, None))
        else:
            registry.register(_CallableTool(name, fn, schema))
    return registry


def _parameters(spec: Mapping[str, Any] | None) -> dict[str, Any] | None:
    if spec is None:
        return None
    function = spec.get("function")
    if isinstance(function, Mapping):
        return dict(function.get("parameters") or {})
    if "parameters" in spec and isinstance(spec["parameters"], Mapping):
        return dict(spec["parameters"])
    return dict(spec)


class _CallableTool(Tool):
    """Any callable under a given name; arguments checked only against ``schema``."""

    def __init__(self, name: str, fn: Callable[..., Any], schema: dict[str, Any] | None) -> None:
        self.name = name
        self.fn = fn
        self.description = inspect.getdoc(fn) or ""
        self.schema_in = schema or {"type": "object", "properties": {}}
        self.schema_out = {}
        self.is_async = inspect.iscoroutinefunction(fn) or (
            not inspect.isroutine(fn) and inspect.iscoroutinefunction(type(fn).__call__)
        )
        self.accepts_state = _accepts(fn, STATE_PARAMETER)

    def __call__(self, **kwargs: Any) -> Any:
        return self.fn(**kwargs)

    async def acall(self, **kwargs: Any) -> Any:
        if self.is_async:
            return await self.fn(**kwargs)
        return await super().acall(**kwargs)


class _Unchecked(Tool):
    """``tool`` without argument validation: its own code (or server) judges the arguments.

    The schema is still shown to the model (``tool_specs``); only the check
    before the call is skipped, so a tool's own message ("Unknown operation:
    invalid") reaches the model instead of a schema error, and values arrive
    as the model wrote them (``5`` stays an int where the signature says float).
    """

    def __init__(self, tool: Tool) -> None:
        self.tool = tool
        self.name = tool.name
        self.description = tool.description
        self.schema_in = tool.schema_in
        self.schema_out = tool.schema_out
        self.accepts_state = tool.accepts_state
        self.is_async = tool.is_async
        self.timeout = tool.timeout

    def validate(self, args: Mapping[str, Any]) -> dict[str, Any]:
        return dict(args)

    def __call__(self, **kwargs: Any) -> Any:
        return self.tool(**kwargs)

    async def acall(self, **kwargs: Any) -> Any:
        if self.is_async:
            return await self.tool.acall(**kwargs)
        return await super().acall(**kwargs)

    def __repr__(self) -> str:
        return f"unchecked({self.tool!r})"


def unchecked(tool: Tool) -> Tool:
    """``tool`` called with the model's arguments as they are (no schema check first)."""
    return tool if isinstance(tool, _Unchecked) else _Unchecked(tool)


def _accepts(fn: Callable[..., Any], keyword: str) -> bool:
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return False
    return any(p.name == keyword for p in params)
