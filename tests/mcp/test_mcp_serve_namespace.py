"""``serve --mcp --session-scope namespace``: Python sessions belong to the namespace a
bearer token proves, not to the MCP connection.

A client that reconnects for every call (verifiers' harness does) keeps its state as
long as it presents the same token; another token can neither see nor close those
sessions; a request without a valid token gets 401 and a body saying what to send;
namespace sessions outlive their connections and are freed by the idle timeout.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import httpx2
import pytest
from tests.mcp._serve_util import (
    CLI,
    INITIALIZE,
    MARK,
    POST_HEADERS,
    WAIT,
    call,
    http_session,
    marked,
    run,
    wait_unmarked,
)

ALICE = "alice-token-0123456789abcdef"
BOB = "bob-token-0123456789abcdef"


@pytest.fixture
def tokens_file(tmp_path: Path) -> str:
    path = tmp_path / "tokens"
    path.write_text(f"# the operator's tokens\n{ALICE}\n\n{BOB}\n")
    return str(path)


def namespaced(serve: Any, tokens_file: str, *args: str) -> Any:
    return serve("--session-scope", "namespace", "--tokens-file", tokens_file, *args)


async def test_one_token_shares_sessions_across_connections(serve: Any, tokens_file: str) -> None:
    _pid, url = namespaced(serve, tokens_file)
    async with http_session(url, token=ALICE) as first:
        await run(first, "x = 41", "s")
    # The first connection ended (DELETE); a new one with the same token finds the state.
    async with http_session(url, token=ALICE) as second:
        assert (await run(second, "print(x + 1)", "s"))["stdout"] == "42\n"


async def test_another_token_neither_sees_nor_closes(serve: Any, tokens_file: str) -> None:
    _pid, url = namespaced(serve, tokens_file)
    async with http_session(url, token=ALICE) as alice, http_session(url, token=BOB) as bob:
        await run(alice, "x = 'alice'", "s")
        closed = await call(bob, "python_close_session", session_id="s")
        assert closed.content[0].text == "Session s was not open (nothing to close)"
        seen = await run(bob, "print(x)", "s")
        assert not seen["success"] and "NameError" in seen["stderr"]
        await run(bob, "x = 'bob'", "s")
        assert (await run(alice, "print(x)", "s"))["stdout"] == "alice\n"
        assert (await run(bob, "print(x)", "s"))["stdout"] == "bob\n"


async def test_sub_namespaces_by_url_keep_rollouts_apart(serve: Any, tokens_file: str) -> None:
    """For clients that can only be given a URL: token and sub-namespace as URL parameters."""
    _pid, url = namespaced(serve, tokens_file)
    one, two = (
        f"{url}?access_token={ALICE}&namespace=r1",
        f"{url}?access_token={ALICE}&namespace=r2",
    )
    async with http_session(one) as a:
        await run(a, "x = 1", "s")
    async with http_session(two) as b:
        missing = await run(b, "print(x)", "s")
        assert not missing["success"] and "NameError" in missing["stderr"]
    async with http_session(one) as a:
        assert (await run(a, "print(x)", "s"))["stdout"] == "1\n"
    # The header form reaches the same namespace as the URL form.
    async with http_session(f"{url}?namespace=r1", token=ALICE) as a:
        assert (await run(a, "print(x)", "s"))["stdout"] == "1\n"


async def _post(url: str, headers: dict[str, str]) -> httpx2.Response:
    async with httpx2.AsyncClient(timeout=WAIT) as client:
        return await client.post(
            url,
            json=INITIALIZE,
            headers={**POST_HEADERS, **headers},
        )


async def test_a_missing_or_wrong_token_is_refused(serve: Any, tokens_file: str) -> None:
    _pid, url = namespaced(serve, tokens_file)
    missing = await _post(url, {})
    assert missing.status_code == 401
    assert missing.headers["www-authenticate"].startswith("Bearer")
    message = json.loads(missing.text)["error"]["message"]
    assert "Authorization: Bearer <token>" in message and "--tokens-file" in message
    wrong = await _post(url, {"Authorization": f"Bearer {ALICE}x"})
    assert wrong.status_code == 401
    assert 'error="invalid_token"' in wrong.headers["www-authenticate"]
    text = json.loads(wrong.text)["error"]["message"]
    assert "not one this server accepts" in text and ALICE not in text
    assert (await _post(f"{url}?access_token=nope", {})).status_code == 401
    bad_sub = await _post(
        url, {"Authorization": f"Bearer {ALICE}", "Toolservices-Namespace": "a/b"}
    )
    assert bad_sub.status_code == 400
    assert (await _post(url, {"Authorization": f"Bearer {BOB}"})).status_code == 200


async def test_namespace_sessions_are_freed_by_the_idle_timeout(
    serve: Any, tokens_file: str
) -> None:
    pid, url = namespaced(serve, tokens_file, "--session-idle-timeout", "2")
    for number in range(3):
        async with http_session(url, token=ALICE) as session:
            await run(session, MARK, f"s-{number}")
    assert marked(pid) == 3  # ended connections leave namespace sessions open ...
    assert await wait_unmarked(pid)  # ... until they idle out
    async with http_session(url, token=ALICE) as session:
        after = await run(session, "print('again')", "s-0")
        assert after["restarted"] and "was closed after 2 s without calls" in after["notice"]


async def test_max_sessions_counts_every_namespace(serve: Any, tokens_file: str) -> None:
    _pid, url = namespaced(serve, tokens_file, "--max-sessions", "1")
    async with http_session(url, token=ALICE) as alice, http_session(url, token=BOB) as bob:
        await run(alice, "x = 1", "s")
        refused = await call(bob, "python_execute", code="print(2)", session_id="s")
        assert refused.is_error and "the limit is 1" in refused.content[0].text


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["--transport", "http", "--session-scope", "namespace"], "needs tokens"),
        (["--session-scope", "namespace", "--token", ALICE], "need --transport http"),
        (["--transport", "http", "--token", "short"], "at least 16 characters"),
    ],
)
def test_bad_configurations_are_refused_before_serving(args: list[str], said: str) -> None:
    done = subprocess.run(
        [CLI, "serve", "--mcp", "--port", "0", *args],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=WAIT,
        env={"PATH": "/usr/bin:/bin"},
    )
    assert done.returncode == 2
    assert said in done.stderr and "Traceback" not in done.stderr
    assert ALICE not in done.stderr
