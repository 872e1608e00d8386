"""Serves a few plain function tools through toolservices.mcp.serve (stdio or HTTP).

``serve_tools.py http`` binds a free port on 127.0.0.1 and reports its URL on
stderr (``toolservices MCP server ready: <url>``).
"""

from __future__ import annotations

import sys

import anyio

from toolservices.mcp import Audio, Image, Resource, ResourceLink, serve
from toolservices.mcp._server import _announce
from toolservices.tools import tool


@tool
def multiply(a: int, b: int) -> int:
    """Multiply two integers."""
    return a * b


@tool
async def slow_echo(text: str, seconds: float = 0.0) -> str:
    """Echo text after a pause."""
    await anyio.sleep(seconds)
    return text


_gates: dict[str, anyio.Event] = {}


def _gate(name: str) -> anyio.Event:
    return _gates.setdefault(name, anyio.Event())


@tool
async def wait_for(gate: str) -> str:
    """Return once release(gate) was called (a rendezvous for tests)."""
    await _gate(gate).wait()
    return f"{gate} passed"


@tool
async def release(gate: str) -> str:
    """Let wait_for(gate) return."""
    _gate(gate).set()
    return "released"


@tool
def explode(message: str) -> str:
    """Always raise."""
    raise RuntimeError(message)


@tool
def describe(values: list[float]) -> dict[str, float]:
    """Count and sum of a list of numbers."""
    return {"count": len(values), "sum": sum(values)}


#: A 1x1 transparent PNG, and a few bytes that stand for a sound.
PNG = bytes.fromhex(
    "89504e470d0a1a0a0000000d4948445200000001000000010806000000"
    "1f15c4890000000d49444154789c6360000002000154a24f5d0000000049454e44ae426082"
)
WAV = b"RIFF\x24\x00\x00\x00WAVEfmt "


@tool
def media() -> list[str | Image | Audio | Resource | ResourceLink]:
    """Text, an image, a sound, two embedded resources and a link."""
    return [
        "here you are",
        Image(data=PNG, mime_type="image/png"),
        Audio(data=WAV, mime_type="audio/wav"),
        Resource(uri="file:///notes.txt", text="some notes", mime_type="text/plain"),
        Resource(uri="file:///blob.bin", data=b"\x00\x01", mime_type="application/octet-stream"),
        ResourceLink(uri="file:///big.csv", name="big.csv", mime_type="text/csv"),
    ]


@tool
def picture() -> Image:
    """Only an image."""
    return Image(data=PNG, mime_type="image/png")


if __name__ == "__main__":
    transport = sys.argv[1] if len(sys.argv) > 1 else "stdio"
    serve(
        [multiply, slow_echo, explode, describe, wait_for, release, media, picture],
        transport=transport,  # type: ignore[arg-type]
        port=0,
        on_ready=_announce,
    )
