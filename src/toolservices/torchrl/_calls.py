"""Parsers and tools as the transforms accept them, normalised once.

Users coming from TorchRL pass a parser object (ours or any callable that
returns a ``{"text", "calls"}`` mapping), a parser family name, or a regex;
and tools as a registry, a list or a ``name -> callable`` dict. Everything
becomes a ``ToolParser``-like callable returning our ``ParseResult`` and a
``ToolRegistry``.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from toolservices.dispatch import call_id_of
from toolservices.errors import ToolDefinitionError, UserError
from toolservices.parsing.base import ParseError, ParseResult, ToolCall
from toolservices.tools import STATE_PARAMETER, FunctionTool, Tool, ToolRegistry

__all__ = [
    "ParserLike",
    "resolve_parser",
    "resolve_registry",
    "resolve_simple_parser",
    "tools_from_mapping",
]

#: A parser family name, a ToolParser, or any ``callable(text) -> mapping``.
ParserLike = Any


def resolve_parser(parser: ParserLike, *, tools: Any = None) -> Callable[[str], ParseResult]:
    """A callable that parses one response into our :class:`ParseResult`."""
    from toolservices.parsing import ToolParser, get_parser

    if isinstance(parser, str):
        return get_parser(parser, tools=tools)
    if isinstance(parser, ToolParser):
        return parser
    if not callable(parser):
        raise UserError(
            f"parser must be a parser family name, a ToolParser or a callable, got {parser!r}"
        )
    return _ForeignParser(parser)


def resolve_simple_parser(
    parser: ParserLike, pattern: str | None, *, tools: Any
) -> Callable[[str], ParseResult]:
    """The ``<tool>`` transforms' rule: ``parser`` if given, else a regex
    ``pattern``, else the ``simple_tool`` family."""
    if parser is not None:
        return resolve_parser(parser, tools=tools)
    if pattern is not None:
        from toolservices.parsing import RegexParser

        return RegexParser(pattern, tools=tools)
    return resolve_parser("simple_tool", tools=tools)


class _ForeignParser:
    """Wraps a TorchRL-style parser: a callable returning a ``{"text", "calls"}`` mapping.

    Its calls may be any objects with ``tool``, ``args`` and ``tag``. If the
    parser raises on a model response, the model sees a parse error instead.
    """

    def __init__(self, parser: Callable[[str], Any]) -> None:
        self.parser = parser

    def __call__(self, text: str) -> ParseResult:
        try:
            raw = self.parser(text)
        except Exception as exc:  # a user parser failing on model output is model-visible
            message = f"The tool calls could not be parsed: {exc}"
            return ParseResult(text=text, errors=[ParseError(message, text[:200])])
        if isinstance(raw, ParseResult):
            return raw
        calls = []
        for index, call in enumerate(_get(raw, "calls") or ()):
            tool = str(_get(call, "tool") or _get(call, "name") or "")
            args = _get(call, "args") or _get(call, "arguments") or {}
            args = dict(args) if isinstance(args, Mapping) else {"raw": args}
            parsed = ToolCall(tool, args, _get(call, "tag"), id=str(_get(call, "id") or ""))
            parsed.id = call_id_of(parsed, index)
            calls.append(parsed)
        return ParseResult(text=str(_get(raw, "text") or ""), calls=calls)

    def __repr__(self) -> str:
        return f"_ForeignParser({self.parser!r})"


def _get(obj: Any, key: str) -> Any:
    if isinstance(obj, Mapping):
        return obj.get(key)
    return getattr(obj, key, None)


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
    tools: Mapping[str, Any], schemas: Mapping[str, Mapping[str, Any]] | None = None
) -> ToolRegistry:
    """Tools named by the dict keys (TorchRL's ``SimpleToolTransform(tools=...)``).

    Typed functions get their schema from the signature; any other callable is
    called with the model's keyword arguments as they are, as TorchRL does. A
    schema in ``schemas`` (JSON Schema of the arguments, or a full OpenAI spec)
    is used for validation and for the chat-template specs.
    """
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


def _accepts(fn: Callable[..., Any], keyword: str) -> bool:
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return False
    return any(p.name == keyword for p in params)
