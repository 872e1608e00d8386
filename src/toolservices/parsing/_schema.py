"""Per-tool argument schemas that parsers use to type raw text values."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from toolservices.tools.jsonschema import coerce_text

__all__ = ["TYPE_ALIASES", "ToolSchemas", "normalise_types"]

#: Type names real tool specs use that JSON Schema spells differently
#: (Python's and C's names, mostly). Keys are lower case.
TYPE_ALIASES: dict[str, str] = {
    **dict.fromkeys(("float", "double", "num", "decimal", "float32", "float64"), "number"),
    **dict.fromkeys(("int", "long", "short", "uint", "unsigned", "int32", "int64"), "integer"),
    "bool": "boolean",
    "str": "string",
    "text": "string",
    **dict.fromkeys(("dict", "map"), "object"),
    **dict.fromkeys(("list", "arr", "tuple", "sequence"), "array"),
    "none": "null",
}
_JSON_TYPES = frozenset(("string", "integer", "number", "boolean", "array", "object", "null"))


def _json_type(name: Any) -> Any:
    if not isinstance(name, str) or name in _JSON_TYPES:
        return name
    lowered = name.strip().lower()
    return lowered if lowered in _JSON_TYPES else TYPE_ALIASES.get(lowered, name)


def normalise_types(schema: Mapping[str, Any]) -> Mapping[str, Any]:
    """``schema`` with its ``type`` names (also in ``anyOf`` / ``oneOf``) in JSON Schema's
    spelling: ``{"type": "float"}`` reads as ``{"type": "number"}``. Unchanged
    schemas are returned as they are (no copy)."""
    declared = schema.get("type")
    plain = type(declared) is str and declared in _JSON_TYPES
    if plain and "anyOf" not in schema and "oneOf" not in schema:
        return schema  # the usual schema: nothing to rename, nothing to walk
    changed: dict[str, Any] = {}
    if isinstance(declared, str):
        if _json_type(declared) != declared:
            changed["type"] = _json_type(declared)
    elif isinstance(declared, list):
        names = [_json_type(name) for name in declared]
        if names != declared:
            changed["type"] = names
    for key in ("anyOf", "oneOf"):
        subs = schema.get(key)
        if isinstance(subs, list):
            fixed = [normalise_types(sub) if isinstance(sub, Mapping) else sub for sub in subs]
            if any(new is not old for new, old in zip(fixed, subs, strict=True)):
                changed[key] = fixed
    return {**schema, **changed} if changed else schema


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
        """The argument's schema, with type names such as ``float`` made JSON Schema's."""
        props = self.parameters.get(tool, {}).get("properties") or {}
        schema = props.get(argument)
        return normalise_types(schema) if isinstance(schema, Mapping) else None

    def coerce(self, tool: str, argument: str, raw: str) -> Any:
        """``raw`` converted to the argument's declared type (kept as text if none)."""
        return coerce_text(self.property_schema(tool, argument), raw)

    def __contains__(self, tool: object) -> bool:
        return tool in self.parameters
