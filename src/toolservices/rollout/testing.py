"""A scripted OpenAI-compatible chat server on loopback, for tests and benchmarks.

:class:`ScriptedChatServer` speaks the chat-completions protocol over real HTTP
(uvicorn in a thread of its own) and replays assistant turns written in
advance, so a rollout can be tested end to end with the real ``openai``
client and no model. Each conversation is told apart by its first user
message; the number of assistant messages in the request says which turn to
answer. A turn is raw text (a model's own tool-call syntax, for client-side
parsing), a message dict with ``tool_calls`` (what a server with a tool
parser returns), or a fault: :class:`Fail` (an HTTP error status) and
:class:`Hang` (no answer until the server closes), each for its first
attempts only, so that retries can be seen to work; :class:`Raw` sends a
broken or foreign answer (HTML, invalid JSON, no choices).

Like vLLM, it returns ``prompt_token_ids`` and per-choice ``token_ids`` when
the request sets ``return_token_ids``, and per-token ``logprobs`` when asked.
With ``stream: true`` it answers in server-sent events (role, content token
by token, tool calls, finish reason, usage with ``include_usage``; no token
ids or logprobs there).
The token ids come from a toy word-level tokenizer (stable across runs), not
from a real model vocabulary.

Needs ``starlette`` and ``uvicorn`` (in the ``dev`` extra; ``mcp`` brings them too).
"""

from __future__ import annotations

import asyncio
import json
import re
import socket
import threading
import time
import zlib
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeAlias

from toolservices.errors import UserError

__all__ = ["Fail", "Hang", "Raw", "ScriptedChatServer", "ScriptedTurn", "toy_tokenize"]


@dataclass(frozen=True, kw_only=True)
class Fail:
    """Answer the first ``times`` attempts at this turn with HTTP ``status``, then ``then``.

    ``times=None`` fails every attempt. ``retry_after`` sets the
    ``Retry-After`` header (seconds).
    """

    status: int
    then: ScriptedTurn | None = None
    times: int | None = 1
    message: str = "injected failure"
    retry_after: float | None = None


@dataclass(frozen=True, kw_only=True)
class Hang:
    """Send nothing for the first ``times`` attempts (until the server closes), then ``then``."""

    then: ScriptedTurn
    times: int = 1


@dataclass(frozen=True, kw_only=True)
class Raw:
    """Answer with exactly this body (a broken or foreign answer), every attempt.

    A dict is sent as JSON, a string as is with ``content_type``.
    """

    body: str | Mapping[str, Any]
    status: int = 200
    content_type: str = "application/json"


#: One scripted assistant turn.
ScriptedTurn: TypeAlias = "str | Mapping[str, Any] | Fail | Hang | Raw"
#: Either prompt -> turns, or a function of the request body returning the turn.
Script: TypeAlias = (
    "Mapping[str, Sequence[ScriptedTurn]] | Callable[[dict[str, Any]], ScriptedTurn]"
)

_TOKEN = re.compile(r"\s*\S+|\s+")


def toy_tokenize(text: str) -> tuple[list[str], list[int]]:
    """Word-level tokens (whitespace kept with the following word) and stable ids."""
    tokens = _TOKEN.findall(text)
    return tokens, [zlib.crc32(t.encode()) % 32_000 for t in tokens]


def _prompt_text(messages: Sequence[Mapping[str, Any]]) -> str:
    parts = []
    for m in messages:
        content = m.get("content")
        text = content if isinstance(content, str) else json.dumps(content)
        if m.get("tool_calls"):
            text += json.dumps(m["tool_calls"], sort_keys=True)
        parts.append(f"<|{m.get('role')}|>{text}")
    return "".join(parts) + "<|assistant|>"


class ScriptedChatServer:
    """An OpenAI-compatible ``/v1/chat/completions`` endpoint replaying a script.

    ``latency`` delays every answer (a stand-in for generation time).
    ``hold_until_in_flight=n`` holds the first requests until ``n`` are in
    flight at once (or ``hold_timeout`` passes), so a test can see a
    client's concurrency reach its limit without timing luck.

    Observations for tests: :attr:`requests` (every request body, in arrival
    order), :attr:`max_in_flight`, :attr:`attempts` ((prompt, turn) -> count).
    """

    def __init__(
        self,
        script: Script,
        *,
        model: str = "scripted",
        latency: float = 0.0,
        hold_until_in_flight: int | None = None,
        hold_timeout: float = 10.0,
        host: str = "127.0.0.1",
        port: int = 0,
    ) -> None:
        if not callable(script) and not isinstance(script, Mapping):
            raise UserError("script must be a mapping prompt -> turns or a callable(body) -> turn")
        self.script = script
        self.model = model
        self.latency = latency
        self.hold_until_in_flight = hold_until_in_flight
        self.hold_timeout = hold_timeout
        self.requests: list[dict[str, Any]] = []
        self.attempts: Counter[tuple[str, int]] = Counter()
        self.in_flight = 0
        self.max_in_flight = 0
        self._host = host
        self._port = port
        self._socket: socket.socket | None = None
        self._thread: threading.Thread | None = None
        self._server: Any = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._release: asyncio.Event | None = None
        self._reached: asyncio.Event | None = None
        self._ready = threading.Event()

    @property
    def url(self) -> str:
        """The base URL to give an OpenAI client (ends in ``/v1``)."""
        if self._socket is None:
            raise UserError("the server is not started; use it as a context manager")
        host, port = self._socket.getsockname()[:2]
        return f"http://{host}:{port}/v1"

    # -- lifecycle ---------------------------------------------------------

    def start(self) -> ScriptedChatServer:
        """Listen now (clients may connect at once) and serve from a thread."""
        try:
            import uvicorn
        except ImportError as exc:  # pragma: no cover - dev extra installs it
            raise UserError(
                "ScriptedChatServer needs uvicorn and starlette: pip install uvicorn starlette"
            ) from exc
        if self._thread is not None:
            raise UserError("the server is already started")
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        # Accepted connections inherit it: without it, uvicorn's separate
        # header and body writes meet the client's delayed ACK (~40 ms a request).
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.bind((self._host, self._port))
        sock.listen(1024)
        self._socket = sock
        config = uvicorn.Config(
            self._app(),
            log_level="warning",
            access_log=False,
            lifespan="off",
            timeout_keep_alive=30,
        )
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(
            target=self._serve, name="scripted-chat-server", daemon=True
        )
        self._thread.start()
        # Connections queue in the listening socket's backlog until uvicorn
        # accepts them; waiting here only makes close() safe to call at once.
        self._ready.wait()
        return self

    def _serve(self) -> None:
        async def main() -> None:
            self._loop = asyncio.get_running_loop()
            self._release = asyncio.Event()
            self._reached = asyncio.Event()
            self._ready.set()
            await self._server.serve(sockets=[self._socket])

        asyncio.run(main())

    def close(self, timeout: float = 10.0) -> None:
        """Stop serving: release hanging answers, close connections, join the thread."""
        thread, loop = self._thread, self._loop
        if thread is None or loop is None:
            return
        self._server.should_exit = True
        self._server.force_exit = True
        if self._release is not None and not loop.is_closed():
            loop.call_soon_threadsafe(self._release.set)
        thread.join(timeout)
        if thread.is_alive():
            raise RuntimeError(f"the scripted chat server did not stop within {timeout} s")
        self._thread = None

    def __enter__(self) -> ScriptedChatServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    async def __aenter__(self) -> ScriptedChatServer:
        return self.start()

    async def __aexit__(self, *exc: object) -> None:
        import anyio

        await anyio.to_thread.run_sync(self.close)

    # -- the app -----------------------------------------------------------

    def _app(self) -> Any:
        from starlette.applications import Starlette
        from starlette.requests import Request
        from starlette.responses import JSONResponse, Response, StreamingResponse
        from starlette.routing import Route

        async def completions(request: Request) -> Response:
            body = await request.json()
            self.requests.append(body)
            self.in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)
            try:
                await self._hold()
                if self.latency:
                    await asyncio.sleep(self.latency)
                status, payload, headers = await self._answer(body)
                if isinstance(payload, Raw):
                    content = payload.body
                    if not isinstance(content, str):
                        content = json.dumps(content)
                    return Response(content, status_code=status, media_type=payload.content_type)
                if body.get("stream") and status == 200:
                    return StreamingResponse(
                        _sse(_chunks(payload, body)), media_type="text/event-stream"
                    )
                return JSONResponse(payload, status_code=status, headers=headers)
            finally:
                self.in_flight -= 1

        async def models(request: Request) -> Response:
            model = {"id": self.model, "object": "model", "owned_by": "toolservices"}
            return JSONResponse({"object": "list", "data": [model]})

        return Starlette(
            routes=[
                Route("/v1/chat/completions", completions, methods=["POST"]),
                Route("/v1/models", models, methods=["GET"]),
            ]
        )

    async def _hold(self) -> None:
        target, reached = self.hold_until_in_flight, self._reached
        if target is None or reached is None or reached.is_set():
            return
        if self.in_flight >= target:
            reached.set()
            return
        try:
            await asyncio.wait_for(reached.wait(), self.hold_timeout)
        except asyncio.TimeoutError:
            reached.set()  # the client never got there: stop holding anyone

    async def _answer(
        self, body: dict[str, Any]
    ) -> tuple[int, dict[str, Any] | Raw, dict[str, str]]:
        messages = body.get("messages") or []
        key = next((m.get("content") for m in messages if m.get("role") == "user"), None)
        turn_index = sum(1 for m in messages if m.get("role") == "assistant")
        if callable(self.script):
            turn: ScriptedTurn | None = self.script(body)
        else:
            turns = self.script.get(key) if isinstance(key, str) else None
            if turns is None:
                return _error(400, f"no script for the prompt {key!r}")
            if turn_index >= len(turns):
                return _error(400, f"the script for {key!r} has only {len(turns)} turn(s)")
            turn = turns[turn_index]
        attempt_key = (str(key), turn_index)
        self.attempts[attempt_key] += 1
        attempt = self.attempts[attempt_key]
        while isinstance(turn, Fail | Hang):
            if isinstance(turn, Hang):
                if attempt <= turn.times:
                    assert self._release is not None
                    await self._release.wait()
                    return _error(503, "the server is shutting down")
                turn = turn.then
                continue
            if turn.times is None or attempt <= turn.times:
                status, payload, headers = _error(turn.status, turn.message)
                if turn.retry_after is not None:
                    headers["retry-after"] = str(turn.retry_after)
                return status, payload, headers
            turn = turn.then
        if turn is None:
            return _error(500, "the script has no turn after its failure")
        if isinstance(turn, Raw):
            return turn.status, turn, {}
        return 200, self._completion(body, turn), {}

    def _completion(self, body: dict[str, Any], turn: str | Mapping[str, Any]) -> dict[str, Any]:
        if isinstance(turn, str):
            message: dict[str, Any] = {"role": "assistant", "content": turn}
        else:
            message = {"role": "assistant", "content": None, **turn}
        text = message.get("content") or ""
        if message.get("tool_calls"):
            text += json.dumps(message["tool_calls"])
            finish = "tool_calls"
        else:
            finish = "stop"
        tokens, ids = toy_tokenize(text)
        _, prompt_ids = toy_tokenize(_prompt_text(body.get("messages") or []))
        choice: dict[str, Any] = {
            "index": 0,
            "message": message,
            "finish_reason": finish,
            "logprobs": None,
        }
        if body.get("logprobs"):
            top = int(body.get("top_logprobs") or 0)
            choice["logprobs"] = {
                "content": [
                    {
                        "token": token,
                        "logprob": -0.01 * (i % 7 + 1),
                        "bytes": list(token.encode()),
                        "top_logprobs": [
                            {"token": token, "logprob": -0.01 * (i % 7 + 1) - k, "bytes": None}
                            for k in range(top)
                        ],
                    }
                    for i, token in enumerate(tokens)
                ]
            }
        payload: dict[str, Any] = {
            "id": f"chatcmpl-{len(self.requests)}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": body.get("model") or self.model,
            "choices": [choice],
            "usage": {
                "prompt_tokens": len(prompt_ids),
                "completion_tokens": len(ids),
                "total_tokens": len(prompt_ids) + len(ids),
            },
        }
        if body.get("return_token_ids"):
            payload["prompt_token_ids"] = prompt_ids
            choice["token_ids"] = ids
        return payload


def _chunks(payload: Mapping[str, Any], body: Mapping[str, Any]) -> list[dict[str, Any]]:
    """A completion as ``chat.completion.chunk`` objects: role, content token by
    token, the tool calls, the finish reason, then usage if asked for."""
    (choice,) = payload["choices"]
    message = choice["message"]
    base = {k: payload[k] for k in ("id", "created", "model")}
    base["object"] = "chat.completion.chunk"

    def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        return {**base, "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}

    chunks = [chunk({"role": "assistant", "content": ""})]
    chunks += [chunk({"content": token}) for token in toy_tokenize(message["content"] or "")[0]]
    if message.get("tool_calls"):
        calls = [{"index": i, **call} for i, call in enumerate(message["tool_calls"])]
        chunks.append(chunk({"tool_calls": calls}))
    chunks.append(chunk({}, choice["finish_reason"]))
    if (body.get("stream_options") or {}).get("include_usage"):
        chunks.append({**base, "choices": [], "usage": payload["usage"]})
    return chunks


async def _sse(chunks: list[dict[str, Any]]) -> Any:
    for chunk in chunks:
        yield f"data: {json.dumps(chunk)}\n\n"
    yield "data: [DONE]\n\n"


def _error(status: int, message: str) -> tuple[int, dict[str, Any], dict[str, str]]:
    if status == 429:
        kind = "rate_limit_error"
    else:
        kind = "server_error" if status >= 500 else "invalid_request_error"
    return status, {"error": {"message": message, "type": kind, "code": status}}, {}
