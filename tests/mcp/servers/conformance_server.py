"""The tools the MCP conformance suite's server scenarios call, written as toolservices tools.

``conformance_server.py`` serves them over streamable HTTP on a free port of
127.0.0.1 through :func:`toolservices.mcp.serve` and reports its URL on
stderr (``toolservices MCP server ready: <url>``). Only scenarios of features
this library offers have a tool here (no logging, progress, sampling or
elicitation from tools).
"""

from __future__ import annotations

import json
from typing import Any

from toolservices.mcp import Audio, Image, Resource, serve
from toolservices.mcp._server import _announce
from toolservices.tools import tool

#: A 1x1 PNG, and a minimal WAV header (the suite checks the MIME types, not the media).
PNG = bytes.fromhex(
    "89504e470d0a1a0a0000000d4948445200000001000000010806000000"
    "1f15c4890000000d49444154789c6360000002000154a24f5d0000000049454e44ae426082"
)
WAV = b"RIFF\x24\x00\x00\x00WAVEfmt \x10\x00\x00\x00\x01\x00\x01\x00\x40\x1f\x00\x00"


@tool
def test_simple_text() -> str:
    """Returns simple text."""
    return "This is a simple text response for testing."


@tool
def test_image_content() -> Image:
    """Returns an image."""
    return Image(data=PNG, mime_type="image/png")


@tool
def test_audio_content() -> Audio:
    """Returns a sound."""
    return Audio(data=WAV, mime_type="audio/wav")


@tool
def test_embedded_resource() -> Resource:
    """Returns an embedded resource."""
    return Resource(
        uri="test://embedded-resource",
        text="This is an embedded resource content.",
        mime_type="text/plain",
    )


@tool
def test_multiple_content_types() -> list[str | Image | Resource]:
    """Returns text, an image and a resource."""
    return [
        "Multiple content types test:",
        Image(data=PNG, mime_type="image/png"),
        Resource(
            uri="test://mixed-content-resource",
            text=json.dumps({"test": "data", "value": 123}),
            mime_type="application/json",
        ),
    ]


@tool
def test_error_handling() -> str:
    """Always fails."""
    raise RuntimeError("This tool intentionally returns an error for testing")


class _SchemaTool:
    """A tool given by its own JSON Schema 2020-12 (kept as written in the listing)."""

    name = "json_schema_2020_12_tool"
    description = "Tool with JSON Schema 2020-12 features"
    schema_in: dict[str, Any] = {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "type": "object",
        "$defs": {
            "address": {
                "type": "object",
                "properties": {"street": {"type": "string"}, "city": {"type": "string"}},
            }
        },
        "properties": {"name": {"type": "string"}, "address": {"$ref": "#/$defs/address"}},
        "additionalProperties": False,
    }
    schema_out: dict[str, Any] = {}

    def __call__(self, **kwargs: Any) -> str:
        return json.dumps(kwargs)


TOOLS = [
    test_simple_text,
    test_image_content,
    test_audio_content,
    test_embedded_resource,
    test_multiple_content_types,
    test_error_handling,
    _SchemaTool(),
]

if __name__ == "__main__":
    serve(TOOLS, transport="http", port=0, on_ready=_announce)
