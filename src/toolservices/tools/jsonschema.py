"""A small JSON Schema checker for tools that bring their own schema.

Tools made from Python functions are validated by pydantic. Tools that only
carry a JSON Schema (TorchRL-style services, MCP server tools) are checked
here: required and unknown properties and the basic types, which is what a
model gets wrong in practice. The messages are written for the model.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

__all__ = ["coerce_text", "schema_errors", "type_names"]

_PY_TYPES: dict[str, tuple[type, ...]] = {
    "string": (str,),
    "integer": (int,),
    "number": (int, float),
    "boolean": (bool,),
    "array": (list, tuple),
    "object": (dict,),
    "null": (type(None),),
}


def type_names(schema: Mapping[str, Any]) -> list[str]:
    """The JSON types a schema admits (``[]`` when it says nothing)."""
    declared = schema.get("type")
    if isinstance(declared, str):
        return [declared]
    if isinstance(declared, list):
        return [t for t in declared if isinstance(t, str)]
    names: list[str] = []
    for key in ("anyOf", "oneOf"):
        for sub in schema.get(key, ()) or ():
            if isinstance(sub, Mapping):
                names.extend(type_names(sub))
    return names


def _matches(value: Any, json_type: str) -> bool:
    if json_type in ("integer", "number") and isinstance(value, bool):
        return False
    if json_type == "integer" and isinstance(value, float):
        return value.is_integer()
    return isinstance(value, _PY_TYPES.get(json_type, (object,)))


def schema_errors(schema: Mapping[str, Any], args: Mapping[str, Any]) -> list[str]:
    """Problems with ``args`` against an object schema, one line each."""
    errors: list[str] = []
    properties: Mapping[str, Any] = schema.get("properties") or {}
    for name in schema.get("required", ()) or ():
        if name not in args:
            errors.append(f"missing required argument '{name}'")
    if schema.get("additionalProperties") is False:
        for name in args:
            if name not in properties:
                allowed = ", ".join(properties) or "none"
                errors.append(f"unexpected argument '{name}' (allowed: {allowed})")
    for name, value in args.items():
        sub = properties.get(name)
        if not isinstance(sub, Mapping):
            continue
        types = type_names(sub)
        if types and not any(_matches(value, t) for t in types):
            shown = json.dumps(value, default=str)
            if len(shown) > 60:
                shown = shown[:57] + "..."
            errors.append(f"argument '{name}' must be {' or '.join(types)}, got {shown}")
        enum = sub.get("enum")
        if isinstance(enum, list) and value not in enum:
            errors.append(f"argument '{name}' must be one of {json.dumps(enum)}")
    return errors


def coerce_text(schema: Mapping[str, Any] | None, raw: str) -> Any:
    """Convert a raw text value (as XML-style formats write them) to its type.

    Without a schema, or when conversion fails, the text is kept as it is:
    validation then reports a precise error instead of a guess.
    """
    if not schema:
        return raw
    types = type_names(schema)
    if not types or "string" in types:
        return raw
    text = raw.strip()
    for json_type in types:
        try:
            if json_type == "integer":
                number = float(text)
                if number.is_integer():
                    return int(number)
            elif json_type == "number":
                number = float(text)
                return int(number) if number.is_integer() and "." not in text else number
            elif json_type == "boolean":
                lowered = text.lower()
                if lowered in ("true", "false"):
                    return lowered == "true"
            elif json_type == "null":
                if text.lower() in ("null", "none", ""):
                    return None
            elif json_type in ("array", "object"):
                value = json.loads(text)
                if _matches(value, json_type):
                    return value
        except ValueError:
            continue
    return raw
