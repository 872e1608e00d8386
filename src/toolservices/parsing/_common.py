"""Building blocks shared by the parser families.

* :class:`Collector` gathers calls, errors and the spans of call syntax to cut
  out of the visible text, so every family reports results the same way.
* :class:`SyntaxParser` is the base of the families: it knows the family's
  syntax (shown to the model in every error message) and builds errors.
* :func:`iter_blocks` finds ``OPEN ... CLOSE`` blocks with plain ``str.find``
  (fast, and an unterminated last block is reported, not lost).
* :func:`xml_params` reads "XML-ish" parameters (``<parameter=K>V</parameter>``
  and friends), tolerating the missing closing tags real models produce.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cached_property
from typing import Any, ClassVar

from toolservices.parsing._json import ArgumentsError
from toolservices.parsing.base import ParseFailure, ParseResult, ToolCall, ToolParser

__all__ = [
    "MAX_ERRORS",
    "Block",
    "Collector",
    "ErrorFlood",
    "SyntaxParser",
    "after_text",
    "iter_blocks",
    "segments",
    "strip_newlines",
    "xml_params",
]


#: Parse errors per response. At the next one the scan stops, with one last
#: ``too_many_errors`` error saying so: a model reads at most this many, and
#: hostile output cannot make a parser do work per error (each JSON syntax
#: error costs a pass over the text before it, inside the ``json`` module).
MAX_ERRORS = 16


class ErrorFlood(Exception):
    """Raised inside a scan when :data:`MAX_ERRORS` is exceeded; ends the scan."""


def _cut(text: str, spans: list[tuple[int, int]]) -> str:
    if not spans:
        return text.strip()
    if len(spans) == 1:  # the usual response: one block of calls
        start, end = spans[0]
        return (text[:start] + text[end:]).strip()
    pieces: list[str] = []
    last = 0
    for start, end in sorted(spans):
        if start > last:
            pieces.append(text[last:start])
        last = max(last, end)
    pieces.append(text[last:])
    return "".join(pieces).strip()


class Collector:
    """Calls, errors and cut spans found in one response."""

    __slots__ = ("_spans", "calls", "errors", "parser", "stopped", "text")

    def __init__(self, parser: SyntaxParser, text: str) -> None:
        self.parser = parser
        self.text = text
        self.calls: list[ToolCall] = []
        self.errors: list[ParseFailure] = []
        self._spans: list[tuple[int, int]] = []
        self.stopped = False

    def cut(self, start: int, end: int) -> None:
        """Remove ``text[start:end]`` from the visible text."""
        if end > start:
            self._spans.append((start, end))

    def call(
        self,
        tool: str,
        args: dict[str, Any],
        *,
        tag: str | None = None,
        id: str = "",
        raw: str | None = None,
    ) -> None:
        self.calls.append(ToolCall(tool, args, tag, id, raw))

    def error(
        self, what: str, raw: str = "", *, kind: str = "invalid_syntax", tool: str | None = None
    ) -> None:
        """Record a parse error; the family's expected syntax is appended.

        At most :data:`MAX_ERRORS` are kept (the model reads them; hostile
        output must not turn into thousands of messages); the rest are counted.
        """
        self.add(self.parser.make_error(what, raw, kind=kind, tool=tool))

    def add(self, error: ParseFailure) -> None:
        """Record a ready-made parse error (same cap as :meth:`error`).

        Past :data:`MAX_ERRORS` this records why the scan stops and raises
        :class:`ErrorFlood`, which :meth:`SyntaxParser._parse` catches.
        """
        if len(self.errors) >= MAX_ERRORS:
            self.stopped = True
            self.errors.append(
                self.parser.make_error(
                    f"more than {MAX_ERRORS} malformed calls; the rest of the response "
                    "was not read. Fix the calls above and send fewer at a time",
                    kind="too_many_errors",
                )
            )
            raise ErrorFlood
        self.errors.append(error)

    def arguments_error(self, error: ArgumentsError, raw: str, *, tool: str | None = None) -> None:
        self.error(error.message, raw, kind=error.kind, tool=tool)

    def result(self, **meta: Any) -> ParseResult:
        if self.stopped:
            meta["scan_stopped"] = True
        return ParseResult(_cut(self.text, self._spans), self.calls, self.errors, meta)


class SyntaxParser(ToolParser):
    """A family with a known syntax, used to write errors a model can learn from."""

    #: One example of a well-formed call, shown in every error message.
    syntax: ClassVar[str] = ""

    def make_error(
        self, what: str, raw: str = "", *, kind: str = "invalid_syntax", tool: str | None = None
    ) -> ParseFailure:
        message = f"Could not parse the tool call: {what}. Expected syntax: {self.syntax}"
        if len(raw) > 2000:
            raw = raw[:2000]
        return ParseFailure(message, raw, tool, kind)

    def _parse(self, text: str) -> ParseResult:
        found = Collector(self, text)
        try:
            self._scan(text, found)
        except ErrorFlood:
            pass  # the last error says the scan stopped
        result = found.result()
        if not result.errors:
            self.check_near_miss(result)
        return result

    def _scan(self, text: str, found: Collector) -> None:
        raise NotImplementedError

    def near_miss_markers(self) -> tuple[str, ...]:
        """Call syntax that must not stay silently in the visible text.

        Default: the special token the family's :attr:`syntax` opens with
        (``<tool_call>``, ``<｜DSML｜function_calls>``...). Families override it.
        """
        if not self.syntax.startswith("<"):
            return ()
        end = self.syntax.find(">")
        return (self.syntax[: end + 1],) if end != -1 else ()

    @cached_property
    def _near_miss(self) -> tuple[str, ...]:
        """:meth:`near_miss_markers`, worked out once per parser (not once per parse)."""
        return self.near_miss_markers()

    def check_near_miss(self, result: ParseResult) -> None:
        """Add a parse error when call syntax is left in the visible text unexplained.

        A response that shows a family's marker but yields neither a call nor
        an error for it is a "near miss" (a typo in a tag, a call outside its
        block...): the model must hear about it rather than get silence.
        """
        for marker in self._near_miss:
            where = result.text.find(marker)
            if where != -1:
                raw = result.text[max(0, where - 100) : where + 400]
                result.errors.append(
                    self.make_error(
                        f"{marker!r} is in the response but no tool call could be read there",
                        raw,
                    )
                )
                return

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


@dataclass(slots=True)
class Block:
    """One ``OPEN body CLOSE`` occurrence; ``closed`` is false when cut short.

    Not frozen: a frozen dataclass's ``__init__`` sets each field through
    ``object.__setattr__`` (0.8 µs a block here, against 0.2 µs); nothing
    changes a block after the scan made it.
    """

    start: int
    body_start: int
    body_end: int
    end: int
    closed: bool

    def body(self, text: str) -> str:
        return text[self.body_start : self.body_end]


def iter_blocks(
    text: str, open_tag: str, close_tag: str, *, start: int = 0, end: int | None = None
) -> Iterator[Block]:
    """Every ``open_tag ... close_tag`` block of ``text[start:end]`` in order.

    The last block may be unterminated (it then runs to ``end``). One pass:
    each search starts where the previous block ended.
    """
    limit = len(text) if end is None else end
    pos = text.find(open_tag, start, limit)
    while pos != -1:
        body_start = pos + len(open_tag)
        close = text.find(close_tag, body_start, limit)
        if close == -1:
            yield Block(pos, body_start, limit, limit, False)
            return
        stop = close + len(close_tag)
        yield Block(pos, body_start, close, stop, True)
        pos = text.find(open_tag, stop, limit)


def after_text(text: str, calls: str) -> str:
    """What ``render`` returns: the visible text, then the rendered calls on a new line."""
    return f"{text}\n{calls}" if text else calls


def strip_newlines(value: str) -> str:
    """Drop one newline (``\\n`` or ``\\r\\n``) at each end, as templates add them."""
    if value.startswith("\r\n"):
        value = value[2:]
    elif value.startswith("\n"):
        value = value[1:]
    if value.endswith("\r\n"):
        value = value[:-2]
    elif value.endswith("\n"):
        value = value[:-1]
    return value


def segments(body: str, open_re: re.Pattern[str]) -> list[tuple[re.Match[str], str]]:
    """Each match of ``open_re`` with the text after it, up to the next match or the end."""
    pieces: list[tuple[re.Match[str], str]] = []
    previous: re.Match[str] | None = None
    for match in open_re.finditer(body):
        if previous is not None:
            pieces.append((previous, body[previous.end() : match.start()]))
        previous = match
    if previous is not None:
        pieces.append((previous, body[previous.end() :]))
    return pieces


def xml_params(
    body: str, open_re: re.Pattern[str], close_tag: str, *, stops: tuple[str, ...] = ()
) -> list[tuple[re.Match[str], str]]:
    """``(opening match, raw value)`` pairs of XML-ish parameters, in order.

    ``open_re`` matches one parameter opening; group 1 is the key. A value
    ends at ``close_tag``, or (when the model forgot it) at the next opening
    or at one of ``stops`` (e.g. ``</function>``). Values lose one newline at
    each end; otherwise they are kept verbatim.
    """
    pairs: list[tuple[re.Match[str], str]] = []
    for match, segment in segments(body, open_re):
        close = segment.find(close_tag)
        if close != -1:
            segment = segment[:close]
        else:
            for stop in stops:
                cut = segment.find(stop)
                if cut != -1:
                    segment = segment[:cut]
        pairs.append((match, strip_newlines(segment)))
    return pairs
