"""A scripted OpenAI-compatible chat server on loopback, for driving trainers' rollout code.

``POST /v1/chat/completions`` answers by script, chosen by the first user
message: each script lists the tool calls of the assistant turns, one turn
per tool result already in the conversation, then a final plain answer.
Stateless: the reply depends only on the request, so concurrent rollouts
cannot disturb each other.
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

COUNT = "n = globals().get('n', 0) + 1; print(n)"
SCRIPTS: dict[str, list[tuple[str, dict[str, Any]]]] = {
    "count": [("python", {"code": COUNT}), ("python", {"code": COUNT})],
    "spin": [("python", {"code": "while True: pass"})],
    "unknown": [("nope", {"x": 1})],
    "hang": [("hang", {"seconds": 1})],
    # our MCP server's tool, as verifiers' harness programs name it (no prefix)
    "mcp": [
        ("python_execute", {"code": "print(6 * 7)"}),
        ("python_execute", {"code": "x = 20", "session_id": "rollout-1"}),
        ("python_execute", {"code": "print(x + 1)", "session_id": "rollout-1"}),
    ],
    # another rollout asking for the first one's variable
    "mcp-peek": [("python_execute", {"code": "print(x)", "session_id": "rollout-1"})],
}
#: The messages of the latest request per script, for tests to read what the tools answered.
LAST_MESSAGES: dict[str, list[dict[str, Any]]] = {}


def _reply(body: dict[str, Any]) -> dict[str, Any]:
    messages = body.get("messages") or []
    first_user = next((m for m in messages if m.get("role") == "user"), {})
    content = first_user.get("content")
    if isinstance(content, list):  # content parts
        content = " ".join(p.get("text", "") for p in content if isinstance(p, dict))
    script = SCRIPTS.get(str(content).strip(), [])
    LAST_MESSAGES[str(content).strip()] = messages
    done = sum(1 for m in messages if m.get("role") == "tool")
    message: dict[str, Any] = {"role": "assistant", "content": None}
    finish = "tool_calls"
    if done < len(script):
        name, args = script[done]
        message["tool_calls"] = [
            {
                "id": f"call_{uuid.uuid4().hex[:8]}",
                "type": "function",
                "function": {"name": name, "arguments": json.dumps(args)},
            }
        ]
    else:
        message["content"] = "done"
        finish = "stop"
    return {
        "id": f"chatcmpl-{uuid.uuid4().hex[:8]}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": body.get("model", "scripted"),
        "choices": [{"index": 0, "message": message, "finish_reason": finish}],
        "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
    }


async def _completions(request: Request) -> JSONResponse:
    return JSONResponse(_reply(await request.json()))


@contextmanager
def serve() -> Iterator[str]:
    """Run the server on 127.0.0.1 (a free port) in a thread; yields its base URL."""
    app = Starlette(routes=[Route("/v1/chat/completions", _completions, methods=["POST"])])
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.listen(128)  # clients that come before the server is up wait in the backlog
    server = uvicorn.Server(uvicorn.Config(app, log_level="error", lifespan="off"))
    thread = threading.Thread(
        target=lambda: asyncio.run(server.serve(sockets=[sock])), name="chat-server", daemon=True
    )
    thread.start()
    try:
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        server.should_exit = True
        thread.join(30)
        sock.close()
