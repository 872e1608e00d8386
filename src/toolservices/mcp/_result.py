"""What an MCP tool call returns, kept whole: every content part plus structured data."""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

import mcp.types as mt

from toolservices.mcp._content import Audio, Image, Resource, ResourceLink

__all__ = ["ContentPart", "MCPResult", "escape_result", "escape_text"]

T = TypeVar("T")


@dataclass(frozen=True, kw_only=True)
class ContentPart:
    """One content block of a result.

    ``type`` is the MCP block type: ``"text"``, ``"image"``, ``"audio"``,
    ``"resource"`` (embedded) or ``"resource_link"``. Binary payloads stay
    base64-encoded, as on the wire, in ``data``.
    """

    type: str
    text: str | None = None
    data: str | None = None
    mime_type: str | None = None
    uri: str | None = None
    raw: Mapping[str, Any] = field(default_factory=dict, repr=False)

    @property
    def value(self) -> str | Image | Audio | Resource | ResourceLink | None:
        """The block as the value a toolservices tool would return for it: the text,
        an :class:`Image`, :class:`Audio`, :class:`Resource` or :class:`ResourceLink`
        (bytes decoded); ``None`` for a kind this library does not know."""
        if self.type == "text":
            return self.text
        if self.type in ("image", "audio") and self.data is not None:
            media = Image if self.type == "image" else Audio
            return media(data=_unb64(self.data), mime_type=self.mime_type or "")
        if self.type == "resource" and self.uri is not None:
            if self.text is not None:
                return Resource(uri=self.uri, text=self.text, mime_type=self.mime_type)
            return Resource(uri=self.uri, data=_unb64(self.data or ""), mime_type=self.mime_type)
        if self.type == "resource_link" and self.uri is not None:
            return ResourceLink(
                uri=self.uri,
                name=str(self.raw.get("name", "")),
                mime_type=self.mime_type,
                description=self.raw.get("description"),
            )
        return None


@dataclass(frozen=True, kw_only=True)
class MCPResult:
    """The result of one ``tools/call``.

    ``is_error`` is the server's own ``isError`` flag: the tool ran and
    reported a failure, whose message is in :attr:`text`.
    """

    server: str
    tool: str
    parts: tuple[ContentPart, ...] = ()
    structured: dict[str, Any] | None = None
    is_error: bool = False

    @property
    def text(self) -> str:
        """The text parts joined by newlines (structured data as JSON if no text)."""
        texts = [p.text for p in self.parts if p.type == "text" and p.text is not None]
        if texts:
            return "\n".join(texts)
        if self.structured is not None:
            return json.dumps(self.structured, ensure_ascii=False)
        return ""

    def contents(self) -> list[str | Image | Audio | Resource | ResourceLink]:
        """Every part as a value (see :attr:`ContentPart.value`), unknown kinds left out."""
        values = [part.value for part in self.parts]
        return [v for v in values if v is not None]

    @property
    def images(self) -> list[ContentPart]:
        """The image parts, in order."""
        return [p for p in self.parts if p.type == "image"]

    def __str__(self) -> str:
        """What a model reads: the text, with placeholders for non-text parts."""
        pieces = []
        for part in self.parts:
            if part.type == "text" and part.text is not None:
                pieces.append(part.text)
            elif part.uri is not None:
                pieces.append(f"[{part.type}: {part.uri}]")
            else:
                pieces.append(f"[{part.type}: {part.mime_type or 'unknown type'}]")
        if not pieces and self.structured is not None:
            return json.dumps(self.structured, ensure_ascii=False)
        return "\n".join(pieces)

    @classmethod
    def from_mcp(cls, server: str, tool: str, result: mt.CallToolResult) -> MCPResult:
        """Convert the SDK's result model (lone surrogates escaped: :func:`escape_result`)."""
        result = escape_result(result)
        return cls(
            server=server,
            tool=tool,
            parts=tuple(_part(block) for block in result.content),
            structured=result.structured_content,
            is_error=bool(result.is_error),
        )


def _part(block: Any) -> ContentPart:
    raw = block.model_dump(by_alias=True, mode="json", exclude_none=True)
    kind = str(raw.get("type", "unknown"))
    if isinstance(block, mt.TextContent):
        return ContentPart(type=kind, text=block.text, raw=raw)
    if isinstance(block, (mt.ImageContent, mt.AudioContent)):
        return ContentPart(type=kind, data=block.data, mime_type=block.mime_type, raw=raw)
    if isinstance(block, mt.EmbeddedResource):
        res = block.resource
        return ContentPart(
            type=kind,
            text=getattr(res, "text", None),
            data=getattr(res, "blob", None),
            mime_type=res.mime_type,
            uri=str(res.uri),
            raw=raw,
        )
    if isinstance(block, mt.ResourceLink):
        return ContentPart(type=kind, uri=str(block.uri), mime_type=block.mime_type, raw=raw)
    return ContentPart(type=kind, raw=raw)


def _unb64(data: str) -> bytes:
    try:
        return base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError):
        return b""  # not base64 after all: no bytes rather than a crash


# --- invalid Unicode -------------------------------------------------------------------


def escape_text(text: str) -> str:
    """``text`` with lone surrogates written as ``\\udXXX`` escapes (else unchanged).

    A Python string can hold them (``chr(0xd800)``, a JSON ``"\\ud800"``), UTF-8
    cannot: serialising such a result fails mid-write (a stdio server then stops
    answering). This is the escape the executor already applies to output.
    """
    if text.isascii():
        return text
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return text.encode("utf-8", "backslashreplace").decode("utf-8")
    return text


def escape_value(value: T) -> T:
    """``value`` with :func:`escape_text` applied to every string in it, keys included.

    Returns ``value`` itself when nothing needed escaping.
    """
    if isinstance(value, str):
        return escape_text(value)  # type: ignore[return-value]
    if isinstance(value, dict):
        pairs = [(k, v, escape_value(k), escape_value(v)) for k, v in value.items()]
        if all(k is ck and v is cv for k, v, ck, cv in pairs):
            return value
        return {ck: cv for _, _, ck, cv in pairs}  # type: ignore[return-value]
    if isinstance(value, (list, tuple)):
        items = [escape_value(v) for v in value]
        if all(a is b for a, b in zip(items, value, strict=True)):
            return value
        return type(value)(items) if isinstance(value, tuple) else items  # type: ignore[return-value]
    return value


def escape_result(result: mt.CallToolResult) -> mt.CallToolResult:
    """The whole result (text, structured content, resources, metadata) with every
    string passed through :func:`escape_text`; ``result`` itself if nothing changed."""
    dumped = result.model_dump(by_alias=True, exclude_unset=True)
    cleaned = escape_value(dumped)
    if cleaned is dumped:
        return result
    return mt.CallToolResult.model_validate(cleaned)
