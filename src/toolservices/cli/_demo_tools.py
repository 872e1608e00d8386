"""Small example tools the demo's episodes call (deterministic, no network)."""

from __future__ import annotations

import ast
import operator
from collections.abc import Callable
from typing import Any, Literal

import anyio

from toolservices.tools import FunctionTool, tool

__all__ = ["DEMO_TOOLS"]

_OPS: dict[type, Callable[..., float]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
    ast.USub: operator.neg,
    ast.UAdd: operator.pos,
}


def _evaluate(node: ast.AST) -> float:
    if isinstance(node, ast.Expression):
        return _evaluate(node.body)
    if isinstance(node, ast.Constant) and isinstance(node.value, int | float):
        return node.value
    if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
        right = _evaluate(node.right)
        if isinstance(node.op, ast.Pow) and abs(right) > 64:
            raise ValueError("exponent too large (at most 64)")
        return _OPS[type(node.op)](_evaluate(node.left), right)
    if isinstance(node, ast.UnaryOp) and type(node.op) in _OPS:
        return _OPS[type(node.op)](_evaluate(node.operand))
    raise ValueError(f"unsupported syntax: {ast.dump(node)[:40]}")


@tool
def calculator(expression: str) -> float:
    """Evaluate an arithmetic expression (+ - * / // % ** and parentheses).

    Args:
        expression: The expression, for example "17 * 23 + 4".
    """
    try:
        tree = ast.parse(expression, mode="eval")
    except SyntaxError as exc:
        raise ValueError(f"not an arithmetic expression: {exc.msg}") from None
    return _evaluate(tree)


_WEATHER = {
    "paris": (18, "cloudy"),
    "tokyo": (24, "sunny"),
    "london": (14, "rain"),
    "new york": (21, "clear"),
    "sydney": (26, "windy"),
}


@tool
async def get_weather(
    city: str, unit: Literal["celsius", "fahrenheit"] = "celsius"
) -> dict[str, Any]:
    """Current weather for a city (a bundled table; simulates 50 ms of latency).

    Args:
        city: City name, for example "Paris".
        unit: Temperature unit.
    """
    await anyio.sleep(0.05)
    try:
        celsius, sky = _WEATHER[city.strip().lower()]
    except KeyError:
        known = ", ".join(c.title() for c in _WEATHER)
        raise ValueError(f"no weather data for {city!r}; known cities: {known}") from None
    temperature = celsius if unit == "celsius" else round(celsius * 9 / 5 + 32, 1)
    return {"city": city.title(), "temperature": temperature, "unit": unit, "sky": sky}


_DOCS = [
    ("fork server", "A fork server pre-imports modules once and forks sessions in milliseconds."),
    ("session affinity", "Calls with the same session id reach the same interpreter."),
    ("timeouts", "Every tool call has a wall-clock time limit; overruns become tool errors."),
    ("parsers", "Parsers turn model output into ordered tool calls and parse errors."),
]


@tool
def search_docs(query: str, top_k: int = 2) -> list[dict[str, Any]]:
    """Search the bundled documentation snippets by keyword overlap.

    Args:
        query: Words to look for.
        top_k: How many snippets to return (1-4).
    """
    if not 1 <= top_k <= len(_DOCS):
        raise ValueError(f"top_k must be between 1 and {len(_DOCS)}")
    words = set(query.lower().split())
    scored = sorted(
        _DOCS,
        key=lambda doc: -len(words & set((doc[0] + " " + doc[1]).lower().split())),
    )
    return [{"title": title, "text": text} for title, text in scored[:top_k]]


@tool
def word_count(text: str) -> int:
    """Count the words in a text.

    Args:
        text: Any text.
    """
    return len(text.split())


DEMO_TOOLS: list[FunctionTool] = [calculator, get_weather, search_docs, word_count]
