"""Python signatures and Google-style docstrings from a tool's JSON Schema.

Hugging Face's ``transformers.utils.get_json_schema`` (which TRL applies to
every tool method of an ``environment_factory`` class) reads a tool from its
type hints and docstring only. This module writes both for any
:class:`~toolservices.Tool`, whatever it was built from (a function, an MCP
server, a service), so the schema the model sees matches ``tool.schema_in``
as closely as type hints can say it.
"""

from __future__ import annotations

import inspect
import keyword
import re
import types
from collections.abc import Callable
from typing import Any, Literal, Union

from toolservices.errors import UserError
from toolservices.tools import Tool

__all__ = ["docstring_for", "hint_for", "make_method", "signature_for"]

_SCALARS: dict[str, Any] = {
    "string": str,
    "integer": int,
    "number": float,
    "boolean": bool,
    "null": type(None),
}
_JSON_SCALAR = (str, int, float, bool, type(None))


def hint_for(schema: Any) -> Any:
    """The Python type hint that says what ``schema`` says (``Any`` when it can't)."""
    if not isinstance(schema, dict):
        return Any
    enum = schema.get("enum")
    if isinstance(enum, list) and enum and all(isinstance(v, _JSON_SCALAR) for v in enum):
        return Literal[tuple(enum)]
    if "const" in schema and isinstance(schema["const"], _JSON_SCALAR):
        return Literal[schema["const"]]
    for key in ("anyOf", "oneOf"):
        options = schema.get(key)
        if isinstance(options, list) and options:
            return _union([hint_for(option) for option in options])
    kind = schema.get("type")
    if isinstance(kind, list):
        return _union([hint_for({**schema, "type": k}) for k in kind])
    if kind in _SCALARS:
        return _SCALARS[kind]
    if kind == "array":
        items = schema.get("items")
        return list[hint_for(items)] if isinstance(items, dict) and items else list  # type: ignore[misc]
    if kind == "object":
        return dict[str, Any]
    return Any


def _union(hints: list[Any]) -> Any:
    unique: list[Any] = []
    for hint in hints:
        if hint is Any:
            return Any
        if hint not in unique:
            unique.append(hint)
    if len(unique) == 1:
        return unique[0]
    return Union[tuple(unique)]  # noqa: UP007 (built from a runtime list)


def signature_for(tool: Tool) -> tuple[inspect.Signature, dict[str, Any]]:
    """A method signature (``self`` first, keyword arguments) and its annotations.

    Required properties come first without defaults; optional ones keep their
    schema default, or ``None``. Raises :class:`UserError` for a property name
    that cannot be a Python parameter.
    """
    schema = tool.schema_in or {}
    properties: dict[str, Any] = schema.get("properties") or {}
    required = [n for n in schema.get("required") or [] if n in properties]
    optional = [n for n in properties if n not in required]
    parameters = [inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)]
    annotations: dict[str, Any] = {}
    for name in [*required, *optional]:
        if not name.isidentifier() or keyword.iskeyword(name) or name == "self":
            raise UserError(
                f"tool '{tool.name}': argument name {name!r} cannot be a Python parameter, "
                "which TRL's schema builder needs; rename it"
            )
        hint = hint_for(properties[name])
        prop = properties[name] if isinstance(properties[name], dict) else {}
        default: Any = inspect.Parameter.empty if name in required else prop.get("default")
        annotations[name] = hint
        parameters.append(
            inspect.Parameter(
                name, inspect.Parameter.POSITIONAL_OR_KEYWORD, default=default, annotation=hint
            )
        )
    annotations["return"] = str
    return inspect.Signature(parameters, return_annotation=str), annotations


def docstring_for(tool: Tool) -> str:
    """A Google-style docstring: the tool's description, then one ``Args:`` line each."""
    description = _one_paragraph(tool.description) or tool.name
    properties: dict[str, Any] = (tool.schema_in or {}).get("properties") or {}
    if not properties:
        return description
    lines = [description, "", "Args:"]
    for name, prop in properties.items():
        text = prop.get("description") if isinstance(prop, dict) else None
        lines.append(f"    {name}: {_one_paragraph(text) or name}")
    return "\n".join(lines)


def _one_paragraph(text: str | None) -> str:
    """Whitespace collapsed, and no line that the docstring parser would take for a section."""
    flat = re.sub(r"\s+", " ", text or "").strip()
    return re.sub(r"\b(Args|Returns|Raises):", r"\1 -", flat)


def make_method(tool: Tool, body: Callable[[Any, str, dict[str, Any]], str]) -> types.FunctionType:
    """A plain function ``name(self, **arguments) -> str`` calling ``body(self, name, arguments)``,
    with the signature, annotations, name and docstring that describe ``tool``."""
    signature, annotations = signature_for(tool)
    name = tool.name

    def method(self: Any, /, **arguments: Any) -> str:
        return body(self, name, arguments)

    method.__name__ = name
    method.__qualname__ = name
    method.__doc__ = docstring_for(tool)
    method.__signature__ = signature  # type: ignore[attr-defined]
    method.__annotations__ = annotations
    return method  # type: ignore[return-value]
