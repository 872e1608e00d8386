"""``--max-request-bytes``: an HTTP request body up to the limit is served, one byte more
gets HTTP 413 with a JSON-RPC error saying what the limit is and which option sets it.

Regression: a request over 4 MiB got a bare 413 ("Request body too large") and no option.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import httpx2
import pytest
from mcp import MCPError
from tests.mcp._serve_util import (
    CLI,
    INITIALIZE,
    POST_HEADERS,
    WAIT,
    call,
    http_session,
    kill_group,
    start_server,
)

LIMIT = 64 * 1024


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    argv = [CLI, "serve", "--mcp", "--transport", "http", "--port", "0"]
    proc, found = start_server([*argv, "--max-request-bytes", str(LIMIT)])
    try:
        yield found
    finally:
        kill_group(proc)


def _initialize(size: int) -> bytes:
    """An ``initialize`` request padded with JSON whitespace to exactly ``size`` bytes."""
    body = json.dumps(INITIALIZE).encode()
    return body + b" " * (size - len(body))


def _check_too_large(response: httpx2.Response, declared: bool) -> None:
    assert response.status_code == 413
    assert response.headers["content-type"] == "application/json"
    error = response.json()["error"]
    assert error["code"] == -32600
    message = error["message"]
    assert f"at most {LIMIT} bytes per request" in message
    assert "--max-request-bytes" in message
    if declared:
        assert f"({LIMIT + 1} bytes)" in message


def test_a_body_at_the_limit_is_served_one_byte_more_is_refused_clearly(url: str) -> None:
    with httpx2.Client(timeout=WAIT) as client:
        at_limit = client.post(url, content=_initialize(LIMIT), headers=POST_HEADERS)
        assert at_limit.status_code == 200, at_limit.text
        over = client.post(url, content=_initialize(LIMIT + 1), headers=POST_HEADERS)
        _check_too_large(over, declared=True)


def test_a_chunked_body_without_a_length_is_limited_too(url: str) -> None:
    def chunks(body: bytes) -> Iterator[bytes]:
        for start in range(0, len(body), 4096):
            yield body[start : start + 4096]

    with httpx2.Client(timeout=WAIT) as client:
        ok = client.post(url, content=chunks(_initialize(LIMIT)), headers=POST_HEADERS)
        assert ok.status_code == 200, ok.text
        over = client.post(url, content=chunks(_initialize(LIMIT + 1)), headers=POST_HEADERS)
        _check_too_large(over, declared=False)


async def test_the_sdk_client_on_both_sides_of_the_limit(url: str) -> None:
    async with http_session(url) as session:
        fits = "s = '" + "x" * (LIMIT - 1024) + "'\nprint(len(s))"
        result = await call(session, "python_execute", code=fits)
        assert result.structured_content["stdout"] == f"{LIMIT - 1024}\n"
        with pytest.raises(MCPError, match=f"at most {LIMIT} bytes"):
            await call(session, "python_execute", code="x" * (LIMIT + 1))
        # The session is still usable.
        again = await call(session, "python_execute", code="print('ok')")
        assert again.structured_content["stdout"] == "ok\n"


def test_the_default_limit_is_4_mib_with_the_same_clear_answer() -> None:
    proc, url = start_server([CLI, "serve", "--mcp", "--transport", "http", "--port", "0"])
    try:
        default = 4 * 1024 * 1024
        with httpx2.Client(timeout=WAIT) as client:
            over = client.post(url, content=_initialize(default + 1), headers=POST_HEADERS)
        assert over.status_code == 413
        assert f"at most {default} bytes per request" in over.json()["error"]["message"]
    finally:
        kill_group(proc)
