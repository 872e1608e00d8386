"""Python sessions over MCP belong to their MCP session: two clients with the same
session_id do not share (or close) an interpreter, a client's interpreters go when it
disconnects or idles out, and ``--max-sessions`` refuses with a message the model can use.

Regressions: sessions were global over HTTP (shared state, one client closing another's
session) and outlived their client (100 disconnected clients left 106 processes).
"""

from __future__ import annotations

from contextlib import AsyncExitStack
from typing import Any

import anyio
from tests.mcp._serve_util import (
    CLI,
    MARK,
    call,
    http_session,
    marked,
    run,
    stdio_session,
    wait_unmarked,
)


async def test_two_clients_with_one_session_id_are_kept_apart(serve: Any) -> None:
    _pid, url = serve()
    async with http_session(url) as a, http_session(url) as b:
        await run(a, "x = 'from a'")
        await run(b, "x = 'from b'")
        assert (await run(a, "print(x)"))["stdout"] == "from a\n"
        assert (await run(b, "print(x)"))["stdout"] == "from b\n"
        closed = await call(a, "python_close_session", session_id="shared")
        assert closed.content[0].text == "Session shared closed"
        assert (await run(b, "print(x)"))["stdout"] == "from b\n"  # b's session is untouched
        after = await run(a, "print(x)")
        assert not after["success"] and "NameError" in after["stderr"]
        assert after["session_id"] == "shared"  # the client's id, not the internal one


async def test_disconnected_clients_free_their_interpreters(serve: Any) -> None:
    pid, url = serve()
    clients = 6
    async with AsyncExitStack() as stack:
        sessions = [await stack.enter_async_context(http_session(url)) for _ in range(clients)]
        async with anyio.create_task_group() as tg:
            for number, session in enumerate(sessions):
                for name in ("s1", "s2"):  # ids unique across clients: the leak alone is tested
                    tg.start_soon(run, session, MARK, f"{name}-of-{number}")
        assert marked(pid) == 2 * clients  # one interpreter per (client, session_id)
    # All clients ended their MCP sessions (DELETE): their interpreters go.
    assert await wait_unmarked(pid)


async def test_vanished_clients_are_freed_by_the_idle_timeout(serve: Any) -> None:
    """No DELETE (a killed client): the idle timeout frees the interpreters."""
    pid, url = serve("--session-idle-timeout", "2")
    for number in range(3):
        async with http_session(url, terminate=False) as session:
            await run(session, MARK, f"s-{number}")
    assert await wait_unmarked(pid)


async def test_max_sessions_refuses_with_a_message_for_the_model(serve: Any) -> None:
    _pid, url = serve("--max-sessions", "2")
    async with http_session(url) as a, http_session(url) as b:
        await run(a, "x = 1", "one")
        await run(b, "x = 2", "two")
        refused = await call(a, "python_execute", code="print(3)", session_id="three")
        assert refused.is_error
        text = refused.content[0].text
        assert "Too many Python sessions are open (the limit is 2)" in text
        assert "python_close_session" in text
        assert (await run(a, "print('one-off')", None))["stdout"] == "one-off\n"
        await call(b, "python_close_session", session_id="two")
        assert (await run(a, "print('now')", "three"))["stdout"] == "now\n"


async def test_idle_sessions_are_closed_and_say_so(serve: Any) -> None:
    pid, url = serve("--session-idle-timeout", "3")
    async with http_session(url) as session:
        await run(session, f"{MARK}; x = 42", "idle")
        assert marked(pid) == 1
        # The session's interpreter goes after 3 s without calls ...
        assert await wait_unmarked(pid)
        # ... and its next call says the state is gone.
        after = await run(session, "print(x)", "idle")
        assert after["restarted"] and "NameError" in after["stderr"]
        assert "was closed after 3 s without calls" in after["notice"]


async def test_stdio_sessions_are_per_process() -> None:
    async with (
        stdio_session([CLI, "serve", "--mcp"]) as a,
        stdio_session([CLI, "serve", "--mcp"]) as b,
    ):
        await run(a, "x = 'a'")
        await run(b, "x = 'b'")
        assert (await run(a, "print(x)"))["stdout"] == "a\n"
        missing = await call(a, "python_close_session", session_id="never")
        assert missing.content[0].text == "Session never was not open (nothing to close)"
