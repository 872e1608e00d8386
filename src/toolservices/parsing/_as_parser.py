"""One normalisation of whatever a caller passes as ``parser=``.

Episodes, ``ToolEnv``, rollouts, trainer adapters and the TorchRL transforms
all accept the same things: a family name, a :class:`ToolParser`, any
callable returning a :class:`ParseResult` or a TorchRL-style ``{"text",
"calls"}`` mapping, or ``None`` for "the calls the server already parsed".
:func:`as_parser` turns each into one callable returning a
:class:`ParseResult`, and says at construction what it cannot use.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any

from toolservices.errors import UserError
from toolservices.parsing.base import ParseFailure, ParseResult, ToolCall, ToolParser, make_call_id

__all__ = ["ParserLike", "ServerCallsParser", "as_parser"]

#: What ``parser=`` accepts: a family name, a parser object, a callable, or ``None``.
ParserLike = str | ToolParser | Callable[[Any], Any] | None


class ServerCallsParser(ToolParser):
    """``parser=None``: the calls a server parsed into the message's ``tool_calls``, only.

    The response's text is never parsed: no syntax in it makes a call, and
    neither its length nor its content can make a parse error. A message
    dict's ``tool_calls`` are read (and checked) as every parser reads them.
    """

    name = "server"

    def __init__(self) -> None:
        super().__init__(max_chars=None)

    def __call__(self, response: str | Mapping[str, Any] | None) -> ParseResult:
        if isinstance(response, Mapping) and response.get("tool_calls"):
            return super().__call__(response)
        return ParseResult(self._text(response).strip())

    def _parse(self, text: str) -> ParseResult:
        return ParseResult(text.strip())


def as_parser(parser: ParserLike, *, tools: Any = None) -> Callable[[Any], ParseResult]:
    """The callable that parses one response into a :class:`ParseResult`.

    * a name: that family (:func:`~toolservices.parsing.get_parser`), with
      ``tools`` (a registry or OpenAI specs) for schema-typed formats;
    * a :class:`ToolParser`: itself;
    * ``None``: a :class:`ServerCallsParser`;
    * any other callable: wrapped, so that a :class:`ParseResult` passes
      through, a ``{"text", "calls"}`` mapping (TorchRL's parsers) becomes one,
      and an exception on a model response becomes a parse error the model
      reads.

    Anything else raises :class:`UserError`.
    """
    if parser is None:
        return ServerCallsParser()
    if isinstance(parser, str):
        from toolservices.parsing.registry import get_parser

        return get_parser(parser, tools=tools)
    if isinstance(parser, ToolParser):
        return parser
    if isinstance(parser, _ForeignParser):
        return parser
    if callable(parser):
        return _ForeignParser(parser)
    raise UserError(
        "parser must be a parser family name, a ToolParser, a callable or None, "
        f"got {type(parser).__name__}: {parser!r}"
    )


class _ForeignParser:
    """A user's parser: a callable returning a ParseResult or a ``{"text", "calls"}`` mapping.

    Its calls may be mappings or objects with ``tool`` (or ``name``), ``args``
    (or ``arguments``: an object, or its JSON text), ``tag`` and ``id``.
    Arguments that are not an object make a parse error, as in every family.
    """

    def __init__(self, parser: Callable[[Any], Any]) -> None:
        self.parser = parser

    def __call__(self, response: Any) -> ParseResult:
        try:
            raw = self.parser(response)
        except Exception as exc:  # a user parser failing on model output is model-visible
            text = response if isinstance(response, str) else str(_get(response, "content") or "")
            message = f"The tool calls could not be parsed: {exc}"
            return ParseResult(text=text, errors=[ParseFailure(message, text[:200])])
        if isinstance(raw, ParseResult):
            return raw
        calls: list[ToolCall] = []
        errors: list[ParseFailure] = []
        for index, call in enumerate(_get(raw, "calls") or ()):
            tool = str(_get(call, "tool") or _get(call, "name") or "")
            args = _arguments(_get(call, "args") or _get(call, "arguments") or {})
            if args is None:
                errors.append(
                    ParseFailure(
                        f"The arguments of tool '{tool}' must be a JSON object",
                        repr(_get(call, "args") or _get(call, "arguments"))[:200],
                        tool or None,
                        "invalid_json",
                    )
                )
                continue
            parsed = ToolCall(tool, args, _get(call, "tag"), id=str(_get(call, "id") or ""))
            if not parsed.id:
                parsed.id = make_call_id(index, tool, args)
            calls.append(parsed)
        return ParseResult(text=str(_get(raw, "text") or ""), calls=calls, errors=errors)

    def __repr__(self) -> str:
        return f"as_parser({self.parser!r})"


def _arguments(args: Any) -> dict[str, Any] | None:
    """A call's arguments as a dict: a mapping, or JSON text of an object; else None."""
    if isinstance(args, Mapping):
        return dict(args)
    if isinstance(args, str):
        try:
            decoded = json.loads(args)
        except ValueError:
            return None
        return dict(decoded) if isinstance(decoded, dict) else None
    return None


def _get(obj: Any, key: str) -> Any:
    if isinstance(obj, Mapping):
        return obj.get(key)
    return getattr(obj, key, None)
