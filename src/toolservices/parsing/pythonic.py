"""Families that write calls as Python expressions: ``[f(a=1), g(b="x")]``.

The call text is parsed with :func:`ast.parse` and only *literal* nodes are
read (strings, numbers, booleans, ``None``, lists, tuples, dicts, sets; JSON's
``true`` / ``false`` / ``null`` too, which OLMo 3 and others write). Nothing
is ever evaluated: a name, an operator or a nested call is a parse error.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Sequence
from typing import Any

from toolservices.parsing._common import Collector, SyntaxParser, after_text, iter_blocks
from toolservices.parsing._json import ArgumentsError
from toolservices.parsing.base import ToolCall
from toolservices.parsing.json_families import read_calls

__all__ = [
    "Lfm2Parser",
    "Llama4PythonicParser",
    "Olmo3Parser",
    "PythonicParser",
    "python_literal",
]


def _problem(message: str) -> ArgumentsError:
    """A Python-syntax problem (the call is not written as the family expects)."""
    return ArgumentsError(message, kind="invalid_syntax")


_NAMED_CONSTANTS: dict[str, Any] = {
    "True": True,
    "False": False,
    "None": None,
    "true": True,
    "false": False,
    "null": None,
}
_LIST_START = re.compile(r"\[\s*[A-Za-z_][\w.]*\s*\(")
_PYTHON_START = "<|python_start|>"
_PYTHON_END = "<|python_end|>"


def _literal(node: ast.AST) -> Any:
    if isinstance(node, ast.Constant) and not isinstance(node.value, bytes | complex):
        return node.value
    if isinstance(node, ast.Name) and node.id in _NAMED_CONSTANTS:
        return _NAMED_CONSTANTS[node.id]
    if isinstance(node, ast.List | ast.Tuple | ast.Set):
        return [_literal(item) for item in node.elts]
    if isinstance(node, ast.Dict):
        if any(key is None for key in node.keys):
            raise _problem("'**' unpacking is not allowed inside a dict value")
        return {
            _key(key): _literal(value) for key, value in zip(node.keys, node.values, strict=True)
        }
    if (
        isinstance(node, ast.UnaryOp)
        and isinstance(node.op, ast.USub | ast.UAdd)
        and isinstance(node.operand, ast.Constant)
        and isinstance(node.operand.value, int | float)
        and not isinstance(node.operand.value, bool)
    ):
        return -node.operand.value if isinstance(node.op, ast.USub) else node.operand.value
    shown = ast.unparse(node)
    raise _problem(
        f"{shown[:40]!r} is not a literal value (use strings in quotes, numbers, True/False, "
        "None, lists or dicts)"
    )


def _key(node: ast.AST | None) -> Any:
    value = _literal(node) if node is not None else None
    if isinstance(value, list | dict):
        raise _problem("dict keys must be strings or numbers")
    return value


def python_literal(value: Any) -> str:
    """``value`` written as a Python literal (the inverse of the reading above)."""
    if isinstance(value, dict):
        items = ", ".join(f"{python_literal(k)}: {python_literal(v)}" for k, v in value.items())
        return "{" + items + "}"
    if isinstance(value, list | tuple):
        return "[" + ", ".join(python_literal(v) for v in value) + "]"
    return repr(value)


def _dotted(node: ast.AST) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        inner = _dotted(node.value)
        return None if inner is None else f"{inner}.{node.attr}"
    return None


def _call(node: ast.AST) -> tuple[str, dict[str, Any]]:
    if not isinstance(node, ast.Call):
        raise _problem(f"{ast.unparse(node)[:40]!r} is not a function call")
    name = _dotted(node.func)
    if name is None:
        raise _problem(f"{ast.unparse(node.func)[:40]!r} is not a tool name")
    if node.args:
        raise _problem(f"{name}(): pass arguments by keyword only, e.g. {name}(arg=value)")
    args: dict[str, Any] = {}
    for keyword in node.keywords:
        if keyword.arg is None:
            raise _problem(f"{name}(): '**' unpacking is not allowed")
        try:
            args[keyword.arg] = _literal(keyword.value)
        except ArgumentsError as error:
            raise _problem(f"{name}(), argument {keyword.arg!r}: {error.message}") from None
    return name, args


def _parse_python(source: str, mode: str) -> ast.AST:
    try:
        return ast.parse(source, mode=mode)
    except SyntaxError as error:
        raise _problem(f"invalid Python syntax ({error.msg})") from None
    except (RecursionError, MemoryError, ValueError):
        raise _problem("invalid Python syntax (nested too deeply)") from None


def list_calls(source: str) -> list[tuple[str, dict[str, Any]]]:
    """The keyword calls of ``source``, a Python list of calls or one bare call (empty list: [])."""
    tree = _parse_python(source, "eval")
    assert isinstance(tree, ast.Expression)
    elements = tree.body.elts if isinstance(tree.body, ast.List) else [tree.body]
    return [_call(node) for node in elements]


#: What the bracket count of :func:`_list_end` looks at: brackets and the opening quotes.
_LIST_TOKEN = re.compile("|".join(("'''", '"""', r"[()\[\]{}'\"]")))
#: The rest of a string after its opening quote, up to and including the closing
#: one; a backslash escapes the next character, whatever it is.
_STRING_REST = {
    quote: re.compile(rf"(?:\\.|[^\\])*?{quote}", re.DOTALL) for quote in ("'", '"', "'''", '"""')
}


def _list_end(text: str, start: int) -> int | None:
    """Index after the ``]`` closing the list at ``start`` (strings skipped), or None.

    A regex jumps from one bracket or quote to the next (a character loop in
    Python costs more than the rest of a one-call parse).
    """
    depth = 0
    pos = start
    token = _LIST_TOKEN.search
    while (found := token(text, pos)) is not None:
        char = found.group()
        pos = found.end()
        if char in "([{":
            depth += 1
        elif char in ")]}":
            depth -= 1
            if depth == 0:
                return pos
        else:  # a quote: skip the string
            rest = _STRING_REST[char].match(text, pos)
            if rest is None:
                return None
            pos = rest.end()
    return None


def _own_line(text: str, start: int, end: int | None) -> bool:
    """True when ``text[start:end]`` is alone on its line(s), as calls are.

    ``end=None`` checks only what comes before (for a list cut off at the end).
    """
    before = text.rfind("\n", 0, start)
    head = text[before + 1 : start].replace(_PYTHON_START, "")
    if end is None:
        return not head.strip()
    after = text.find("\n", end)
    tail = text[end : len(text) if after == -1 else after].replace(_PYTHON_END, "")
    return not head.strip() and not tail.strip()


def _render_call(call: ToolCall) -> str:
    """``name(k=literal, ...)``, the call syntax every pythonic family shares."""
    args = ", ".join(f"{k}={python_literal(v)}" for k, v in call.args.items())
    return f"{call.tool}({args})"


class PythonicParser(SyntaxParser):
    """Llama 3.2 / ToolACE style: one Python list of keyword-argument calls.

    A bracketed list that does not parse is reported when it stands on its
    own line (where calls go); in the middle of prose it is left as text.
    """

    name = "pythonic"
    syntax = "[tool_name(arg='value', n=1), other_tool()]"

    def near_miss_markers(self) -> tuple[str, ...]:
        return ()  # a bracketed list in prose is prose, deliberately (see above)

    def _scan(self, text: str, found: Collector) -> None:
        pos = 0
        while (match := _LIST_START.search(text, pos)) is not None:
            start = match.start()
            end = _list_end(text, start)
            if end is None:
                if _own_line(text, start, None):
                    found.error(
                        "the list of calls is never closed with ']' (truncated?)",
                        text[start:],
                        kind="truncated",
                    )
                return
            try:
                calls = list_calls(text[start:end])
            except ArgumentsError as error:
                if _own_line(text, start, end):
                    found.arguments_error(error, text[start:end])
                pos = end  # a list in prose is prose, inner lists included (one pass)
                continue
            raw = text[start:end]  # one object for all: hashed once for the ids
            for name, args in calls:
                found.call(name, args, raw=raw)
            found.cut(start, end)
            pos = end

    def render(self, calls: Sequence[ToolCall], text: str = "") -> str:
        inner = ", ".join(_render_call(c) for c in calls)
        out = f"[{inner}]"
        return after_text(text, out)


class Llama4PythonicParser(PythonicParser):
    """Llama 4: the pythonic list, optionally in ``<|python_start|>...<|python_end|>``."""

    name = "llama4_pythonic"
    syntax = "<|python_start|>[tool_name(arg='value'), other_tool()]<|python_end|>"

    def near_miss_markers(self) -> tuple[str, ...]:
        return (_PYTHON_START,)  # checked in _scan: the token is cut from the text

    def _scan(self, text: str, found: Collector) -> None:
        for token in (_PYTHON_START, _PYTHON_END):
            pos = text.find(token)
            while pos != -1:
                found.cut(pos, pos + len(token))
                pos = text.find(token, pos + 1)
        super()._scan(text, found)
        if not found.calls and not found.errors and _PYTHON_START in text:
            found.error(f"{_PYTHON_START} must be followed by a list of calls", text[:2000])

    def render(self, calls: Sequence[ToolCall], text: str = "") -> str:
        out = _PYTHON_START + PythonicParser.render(self, calls) + _PYTHON_END
        return after_text(text, out)


class Olmo3Parser(SyntaxParser):
    """OLMo 3: ``<function_calls>f(a='x')\\ng(b=1)</function_calls>``, one call per line."""

    name = "olmo3"
    syntax = "<function_calls>\ntool_name(arg='value')\nother_tool(n=1)\n</function_calls>"

    def near_miss_markers(self) -> tuple[str, ...]:
        return ("<function_calls>", "</function_calls>")

    def _scan(self, text: str, found: Collector) -> None:
        for block in iter_blocks(text, "<function_calls>", "</function_calls>"):
            raw = text[block.start : block.end]
            try:
                tree = _parse_python(block.body(text).strip(), "exec")
                assert isinstance(tree, ast.Module)
                calls = [
                    _call(stmt.value if isinstance(stmt, ast.Expr) else stmt) for stmt in tree.body
                ]
                if not calls:
                    raise _problem("the block holds no call")
            except ArgumentsError as error:
                if not block.closed:
                    error = ArgumentsError(
                        "the <function_calls> block is never closed with </function_calls> "
                        f"(truncated?): {error.message}",
                        truncated=True,
                    )
                found.arguments_error(error, raw)
                continue
            if not block.closed:
                found.error(
                    "the <function_calls> block is never closed with </function_calls> "
                    "(truncated?)",
                    raw,
                    kind="truncated",
                )
                continue
            for name, args in calls:
                found.call(name, args, raw=raw)
            found.cut(block.start, block.end)

    def render(self, calls: Sequence[ToolCall], text: str = "") -> str:
        lines = "\n".join(_render_call(c) for c in calls)
        out = f"<function_calls>\n{lines}\n</function_calls>"
        return after_text(text, out)


# --- lfm2 -----------------------------------------------------------------------------

_LFM_START = "<|tool_call_start|>"
_LFM_END = "<|tool_call_end|>"


def _lfm2_calls(body: str) -> list[tuple[str, dict[str, Any]]]:
    """The calls of one block: a JSON array of call objects, or a Python list of calls."""
    stripped = body.strip()
    if not stripped:
        raise ArgumentsError("the block is empty: write a list of calls", kind="invalid_syntax")
    if stripped.startswith("{") or (
        stripped.startswith("[") and stripped[1:].lstrip().startswith("{")
    ):
        return [(name, args) for name, args, _ in read_calls(stripped)]
    calls = list_calls(stripped)
    if not calls:
        raise ArgumentsError("the list of calls is empty", kind="invalid_syntax")
    return calls


class Lfm2Parser(SyntaxParser):
    """Liquid LFM2 / LFM2.5: ``<|tool_call_start|>[f(a='x')]<|tool_call_end|>``.

    The list is Python literals only (JSON's ``true``/``false``/``null`` too);
    a JSON array of ``{"name", "arguments"}`` objects is read as well. A
    complete list whose end token never came is accepted.
    """

    name = "lfm2"
    syntax = f"{_LFM_START}[tool_name(arg='value', n=1), other_tool()]{_LFM_END}"

    def _scan(self, text: str, found: Collector) -> None:
        for block in iter_blocks(text, _LFM_START, _LFM_END):
            raw = text[block.start : block.end]
            try:
                calls = _lfm2_calls(block.body(text))
            except ArgumentsError as error:
                if not block.closed:
                    error = ArgumentsError(
                        f"the call list is never closed with {_LFM_END} (truncated?): "
                        f"{error.message}",
                        truncated=True,
                    )
                found.arguments_error(error, raw)
                continue
            for name, args in calls:
                found.call(name, args, raw=raw)
            found.cut(block.start, block.end)

    def render(self, calls: Sequence[ToolCall], text: str = "") -> str:
        rendered = ", ".join(
            f"{call.tool}("
            + ", ".join(f"{k}={python_literal(v)}" for k, v in call.args.items())
            + ")"
            for call in calls
        )
        return after_text(text, f"{_LFM_START}[{rendered}]{_LFM_END}")
