"""Cutting long output for a model: keep the head and the tail, say what was left out.

A test run's verdict, a compiler's last error and a traceback's cause are at
the end; a command's purpose is usually clear from its start. Both are kept.
"""

from __future__ import annotations

import re

__all__ = ["capped_text", "clip_middle", "omitted_marker"]


def omitted_marker(count: int) -> str:
    """The line put where ``count`` bytes were cut out."""
    return f"\n[... {count} bytes omitted ...]\n"


def capped_text(data: bytes, omitted: int) -> tuple[str, bool]:
    """A Python call's output as kept (the head, ``data``) and whether ``omitted`` bytes past
    its cap were left out, said by the executor's marker (the executor's sessions and the
    Python tool in a shell session read alike)."""
    text = data.decode("utf-8", "replace")
    if omitted:
        text += f"\n[... output truncated: {omitted} more bytes not shown ...]\n"
    return text, bool(omitted)


def clip_middle(text: str, limit: int | None) -> str:
    """``text`` if its UTF-8 form fits ``limit`` bytes; else its head and tail around a marker.

    The head gets half of ``limit`` and the tail the rest; a character cut in
    two at either edge is dropped. A marker in the part cut out (the
    service's own cut) is counted in: the new one says how much of the
    original output is missing.
    """
    if limit is None:
        return text
    data = text.encode("utf-8", "surrogatepass")
    if len(data) <= limit:
        return text
    head = limit // 2
    tail = limit - head
    middle = data[head : len(data) - tail]
    count = len(middle)
    for found in _MARKER.finditer(middle):
        count += int(found.group(1)) - len(found.group(0))
    return (
        data[:head].decode("utf-8", "ignore")
        + omitted_marker(count)
        + (data[-tail:].decode("utf-8", "ignore") if tail else "")
    )


_MARKER = re.compile(rb"\n\[\.\.\. (\d+) bytes omitted \.\.\.\]\n")
