"""Results that hold invalid Unicode (lone surrogates) reach the client escaped, and the
server keeps answering (regression: the stdio server wedged, the HTTP answer broke)."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator

import pytest
from tests.mcp._serve_util import (
    CLI,
    HOSTILE,
    call,
    http_session,
    kill_group,
    start_server,
    stdio_session,
)

RAISE = "raise ValueError(chr(0xd800))"


def _no_surrogates(result: object) -> None:
    """Every string the client got is valid Unicode (it went through JSON in UTF-8)."""
    dumped = json.dumps(result.model_dump(mode="json"), ensure_ascii=False)  # type: ignore[attr-defined]
    dumped.encode("utf-8")  # raises on a lone surrogate


async def _check_python(session: object) -> None:
    result = await call(session, "python_execute", code=RAISE)  # type: ignore[arg-type]
    _no_surrogates(result)
    data = result.structured_content
    assert data is not None and not data["success"]
    assert data["exception"] == {"type": "ValueError", "message": "\\ud800"}
    assert "ValueError: \\ud800" in data["stderr"]
    assert "\\ud800" in result.content[0].text
    # The server still answers.
    again = await call(session, "python_execute", code="print('still here')")  # type: ignore[arg-type]
    assert again.structured_content["stdout"] == "still here\n"


async def test_stdio_python_exception_with_a_lone_surrogate() -> None:
    async with stdio_session([CLI, "serve", "--mcp"]) as session:
        await _check_python(session)


@pytest.fixture
def http_cli() -> Iterator[str]:
    proc, url = start_server([CLI, "serve", "--mcp", "--transport", "http", "--port", "0"])
    try:
        yield url
    finally:
        kill_group(proc)


async def test_http_python_exception_with_a_lone_surrogate(http_cli: str) -> None:
    async with http_session(http_cli) as session:
        await _check_python(session)


async def _check_registry_tools(session: object) -> None:
    text = await call(session, "surrogate_text")  # type: ignore[arg-type]
    _no_surrogates(text)
    assert not text.is_error and text.content[0].text == "bad \\ud800"
    data = await call(session, "surrogate_dict")  # type: ignore[arg-type]
    _no_surrogates(data)
    assert data.structured_content == {"key\\udfff": ["ok", "v\\ud800"], "n": 1}
    error = await call(session, "surrogate_error")  # type: ignore[arg-type]
    _no_surrogates(error)
    assert error.is_error and "boom \\udc80" in error.content[0].text


async def test_stdio_any_registry_result_is_escaped() -> None:
    async with stdio_session([sys.executable, HOSTILE]) as session:
        await _check_registry_tools(session)


async def test_http_any_registry_result_is_escaped() -> None:
    proc, url = start_server([sys.executable, HOSTILE, "http"])
    try:
        async with http_session(url) as session:
            await _check_registry_tools(session)
    finally:
        kill_group(proc)


def test_our_client_escapes_what_it_is_handed() -> None:
    """Over JSON the SDK refuses lone surrogates; an in-process (in-memory) server hands
    its result objects over as they are, and MCPResult escapes them."""
    import mcp.types as mt

    from toolservices.mcp import MCPResult

    raw = mt.CallToolResult(
        content=[mt.TextContent(type="text", text="a\ud800")],
        structured_content={"k\udfff": ["\ud800"]},
    )
    result = MCPResult.from_mcp("srv", "tool", raw)
    assert result.text == "a\\ud800"
    assert result.structured == {"k\\udfff": ["\\ud800"]}
    str(result).encode("utf-8")
