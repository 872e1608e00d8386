"""Per-tool argument schemas that parsers use to type raw text values."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from toolservices.tools._jsonschema import coerce_text

__all__ = ["ToolSchemas"]


@dataclass(frozen=True)
class ToolSchemas:
    """``tool name -> parameters JSON Schema``, built from what users have.

    Accepts ``None``, a :class:`~toolservices.ToolRegistry` (or anything with
    ``openai_specs()``), or an iterable of OpenAI-style specs
    (``{"type": "function", "function": {...}}``) or bare function dicts
    (``{"name", "parameters"}``).
    """

    parameters: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)

    @classmethod
    def from_tools(cls, tools: Any) -> ToolSchemas:
        if tools is None:
            return cls()
        if isinstance(tools, ToolSchemas):
            return tools
        specs: Iterable[Any] = tools.openai_specs() if hasattr(tools, "openai_specs") else tools
        parameters: dict[str, Mapping[str, Any]] = {}
        for spec in specs:
            if not isinstance(spec, Mapping):
                continue
            fn = spec.get("function", spec)
            name = fn.get("name")
            if isinstance(name, str):
                parameters[name] = fn.get("parameters") or {}
        return cls(parameters)

    def property_schema(self, tool: str, argument: str) -> Mapping[str, Any] | None:
        props = self.parameters.get(tool, {}).get("properties") or {}
        schema = props.get(argument)
        return schema if isinstance(schema, Mapping) else None

    def coerce(self, tool: str, argument: str, raw: str) -> Any:
        """``raw`` converted to the argument's declared type (kept as text if none)."""
        return coerce_text(self.property_schema(tool, argument), raw)

    def __contains__(self, tool: object) -> bool:
        return tool in self.parameters
