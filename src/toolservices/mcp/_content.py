"""Media a tool can return over MCP: images, audio and resources, as small typed values.

A served tool returns one of these, or a list mixing them with strings, and
the client receives MCP content blocks of the same kinds (in that order);
:meth:`MCPResult.contents <toolservices.mcp.MCPResult.contents>` turns a
result's blocks back into these values. Binary data is ``bytes`` here and
base64 only on the wire. Their ``str()`` is a short placeholder (what a model
reads in place of the bytes), so they render sanely anywhere else too.
"""

from __future__ import annotations

import base64
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, TypeAlias

import mcp.types as mt

from toolservices.errors import UserError

__all__ = ["Audio", "Content", "Image", "Resource", "ResourceLink", "to_blocks"]


@dataclass(frozen=True, kw_only=True)
class Image:
    """An image: its bytes and MIME type (``image/png``, ``image/jpeg``...)."""

    data: bytes
    mime_type: str

    def __str__(self) -> str:
        return f"[image: {self.mime_type}, {len(self.data)} bytes]"


@dataclass(frozen=True, kw_only=True)
class Audio:
    """A sound: its bytes and MIME type (``audio/wav``, ``audio/mpeg``...)."""

    data: bytes
    mime_type: str

    def __str__(self) -> str:
        return f"[audio: {self.mime_type}, {len(self.data)} bytes]"


@dataclass(frozen=True, kw_only=True)
class Resource:
    """A resource sent with the result: ``text`` or ``data`` (bytes), exactly one."""

    uri: str
    text: str | None = None
    data: bytes | None = None
    mime_type: str | None = None

    def __post_init__(self) -> None:
        if (self.text is None) == (self.data is None):
            raise UserError(f"Resource {self.uri!r}: give exactly one of 'text' or 'data'")

    def __str__(self) -> str:
        return f"[resource: {self.uri}]"


@dataclass(frozen=True, kw_only=True)
class ResourceLink:
    """A pointer to a resource the client may fetch itself (not its content)."""

    uri: str
    name: str
    mime_type: str | None = None
    description: str | None = None

    def __str__(self) -> str:
        return f"[resource_link: {self.uri}]"


#: What a tool may return to send MCP content (a list may mix these with strings).
Content: TypeAlias = "Image | Audio | Resource | ResourceLink"
_CONTENT = (Image, Audio, Resource, ResourceLink)
#: The SDK's own content blocks, which a tool may also return as they are.
_BLOCKS = (mt.TextContent, mt.ImageContent, mt.AudioContent, mt.EmbeddedResource, mt.ResourceLink)


def to_blocks(value: Any) -> list[mt.ContentBlock] | None:
    """``value`` as MCP content blocks, or ``None`` when it holds no media.

    One media value, or a list or tuple of media values and strings (at least
    one media value), qualifies; anything else is not content.
    """
    if isinstance(value, (*_CONTENT, *_BLOCKS)):
        return [_block(value)]
    if isinstance(value, Sequence) and not isinstance(value, (str, bytes)):
        items = list(value)
        if any(isinstance(v, (*_CONTENT, *_BLOCKS)) for v in items) and all(
            isinstance(v, (str, *_CONTENT, *_BLOCKS)) for v in items
        ):
            return [_block(v) for v in items]
    return None


def _block(value: Any) -> mt.ContentBlock:
    if isinstance(value, _BLOCKS):
        return value
    if isinstance(value, str):
        return mt.TextContent(type="text", text=value)
    if isinstance(value, Image):
        return mt.ImageContent(type="image", data=_b64(value.data), mime_type=value.mime_type)
    if isinstance(value, Audio):
        return mt.AudioContent(type="audio", data=_b64(value.data), mime_type=value.mime_type)
    if isinstance(value, Resource):
        contents: mt.TextResourceContents | mt.BlobResourceContents
        if value.text is not None:
            contents = mt.TextResourceContents(
                uri=value.uri, text=value.text, mime_type=value.mime_type
            )
        else:
            assert value.data is not None
            contents = mt.BlobResourceContents(
                uri=value.uri, blob=_b64(value.data), mime_type=value.mime_type
            )
        return mt.EmbeddedResource(type="resource", resource=contents)
    assert isinstance(value, ResourceLink)
    return mt.ResourceLink(
        type="resource_link",
        uri=value.uri,
        name=value.name,
        mime_type=value.mime_type,
        description=value.description,
    )


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")
