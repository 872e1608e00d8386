"""Tool contract: schemas from typed functions, validation, registry."""

from __future__ import annotations

from typing import Literal

import pytest

from toolservices import (
    ToolArgumentError,
    ToolDefinitionError,
    ToolNotFoundError,
    ToolRegistry,
    UserError,
    tool,
)
from toolservices.tools import ServiceTool, function_schema
from toolservices.tools._function_schema import parse_docstring
from toolservices.tools.jsonschema import coerce_text, schema_errors


@tool
def search(query: str, top_k: int = 3, mode: Literal["fast", "exact"] = "fast") -> list[str]:
    """Search the corpus.

    Args:
        query: What to look for.
        top_k: How many hits
            to return.
        mode: Search strategy.
    """
    return [query] * top_k


def test_schema_from_hints_and_docstring() -> None:
    spec = search.openai_spec()
    assert spec["type"] == "function"
    fn = spec["function"]
    assert fn["name"] == "search"
    assert fn["description"] == "Search the corpus."
    params = fn["parameters"]
    assert params["required"] == ["query"]
    assert params["additionalProperties"] is False
    assert params["properties"]["query"] == {"type": "string", "description": "What to look for."}
    assert params["properties"]["top_k"]["description"] == "How many hits to return."
    assert params["properties"]["top_k"]["default"] == 3
    assert params["properties"]["mode"]["enum"] == ["fast", "exact"]


def test_validation_converts_and_reports_every_problem() -> None:
    assert search.validate({"query": "x", "top_k": "2"}) == {
        "query": "x",
        "top_k": 2,
        "mode": "fast",
    }
    with pytest.raises(ToolArgumentError) as info:
        search.validate({"top_k": "many", "colour": "red"})
    message = str(info.value)
    assert message.startswith("Invalid arguments for tool 'search':")
    assert "missing required argument 'query'" in message
    assert "argument 'top_k'" in message and "'many'" in message
    assert "unexpected argument 'colour'" in message


def test_sphinx_and_numpy_docstrings() -> None:
    _, sphinx = parse_docstring("Do it.\n\n:param a: first\n:param b: second\n")
    assert sphinx == {"a": "first", "b": "second"}
    _, numpy = parse_docstring(
        "Do it.\n\nParameters\n----------\na : int\n    first one\nb : str\n    second\n"
    )
    assert numpy == {"a": "first one", "b": "second"}


def test_definition_errors_are_collected() -> None:
    def bad(*items: int, _secret: int = 1) -> None:
        """Bad.

        Args:
            ghost: not a parameter
        """

    with pytest.raises(ToolDefinitionError) as info:
        function_schema(bad)
    # Pinned whole: one message naming the function and every problem, one per line.
    assert str(info.value) == (
        "Cannot build a tool from test_definition_errors_are_collected.<locals>.bad:\n"
        "  *items: tools take keyword arguments only\n"
        "  _secret: parameter names starting with '_' are reserved\n"
        "  docstring describes 'ghost', which is not a parameter"
    )


def test_state_parameter_is_hidden_and_detected() -> None:
    @tool
    def with_state(x: int, _state: dict | None = None) -> int:
        return x

    @tool
    def plain(x: int) -> int:
        return x

    assert with_state.accepts_state
    assert "_state" not in with_state.schema_in["properties"]
    assert not plain.accepts_state


async def test_async_tool() -> None:
    @tool(name="twice", timeout=2.0)
    async def double(x: int) -> int:
        """Double it."""
        return 2 * x

    assert double.is_async and double.timeout == 2.0 and double.name == "twice"
    assert await double.acall(x=4) == 8
    with pytest.raises(TypeError, match="async"):
        double(x=1)


class EchoService:
    """A TorchRL-style service: name, schemas, __call__(**kwargs) -> dict."""

    name = "echo"
    schema_in = {
        "type": "object",
        "properties": {"text": {"type": "string"}},
        "required": ["text"],
        "additionalProperties": False,
    }
    schema_out = {"type": "object"}

    def __call__(self, text: str, **kwargs: object) -> dict:
        return {"echo": text}


def test_service_objects_are_tools() -> None:
    registry = ToolRegistry([EchoService(), search])
    echo = registry.get("echo")
    assert isinstance(echo, ServiceTool)
    assert echo.accepts_state  # **kwargs
    assert echo(text="hi") == {"echo": "hi"}
    assert "echo" in registry and "nope" not in registry
    with pytest.raises(ToolArgumentError, match="missing required argument 'text'"):
        echo.validate({})
    with pytest.raises(ToolArgumentError, match="must be string"):
        echo.validate({"text": 3})
    assert [s["function"]["name"] for s in registry.openai_specs()] == ["echo", "search"]


def test_registry_errors() -> None:
    registry = ToolRegistry([search])
    with pytest.raises(KeyError, match="Unknown tool: nope") as info:
        registry.get("nope")
    assert isinstance(info.value, ToolNotFoundError)
    assert "Available tools: search" in str(info.value)
    with pytest.raises(UserError, match="already registered"):
        registry.register(search)
    registry.register(search, replace=True)
    with pytest.raises(ToolDefinitionError):
        registry.register(42)


def test_coerce_text_uses_schema_types() -> None:
    assert coerce_text({"type": "integer"}, " 5 ") == 5
    assert coerce_text({"type": "number"}, "2.5") == 2.5
    assert coerce_text({"type": "boolean"}, "True") is True
    assert coerce_text({"type": "array"}, "[1, 2]") == [1, 2]
    assert coerce_text({"type": "string"}, "5") == "5"
    assert coerce_text(None, "5") == "5"
    assert coerce_text({"type": "integer"}, "five") == "five"  # left for validation
    assert schema_errors({"properties": {"n": {"type": "integer"}}}, {"n": True}) == [
        "argument 'n' must be integer, got true"
    ]
