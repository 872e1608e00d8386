"""Checking a client's message before the SDK sees it, and answering a bad one ourselves.

JSON-RPC 2.0 asks for ``-32700`` (Parse error) when a message is not JSON and
``-32600`` (Invalid Request) when it is JSON but not a JSON-RPC message, both
with ``"id": null`` when the id cannot be read. The SDK answers the second
over HTTP as ``-32602`` with pydantic's whole validation report (1-2 KB), and
over stdio not at all. Both transports pass each message through
:func:`check_message` first and send its short answer instead.
"""

from __future__ import annotations

from typing import Any

import mcp.types as mt
import pydantic
import pydantic_core

__all__ = ["check_message", "error_body", "rejection"]


def check_message(data: bytes | str) -> mt.JSONRPCError | None:
    """``None`` for a well-formed JSON-RPC message, else the error that answers it."""
    try:
        raw = pydantic_core.from_json(data)
    except ValueError as exc:
        reason = str(exc).split(" at line ")[0]
        return _error(
            None, mt.PARSE_ERROR, f"Parse error: the message is not valid JSON ({reason})"
        )
    problem = _shape_problem(raw)
    if problem is None:
        try:
            mt.jsonrpc_message_adapter.validate_python(raw, by_name=False)
        except pydantic.ValidationError:
            problem = "it is not a JSON-RPC 2.0 request, notification or response"
        else:
            return None
    ident = raw.get("id") if isinstance(raw, dict) else None
    if isinstance(ident, bool) or not isinstance(ident, (int, str)):
        ident = None
    return _error(ident, mt.INVALID_REQUEST, f"Invalid Request: {problem}")


def rejection(exc: Exception) -> mt.JSONRPCError:
    """The answer to a message the SDK's own reader could not decode (``exc``)."""
    errors = exc.errors() if isinstance(exc, pydantic.ValidationError) else []
    if any(e.get("type") == "json_invalid" for e in errors):
        return _error(None, mt.PARSE_ERROR, "Parse error: the message is not valid JSON")
    return _error(None, mt.INVALID_REQUEST, "Invalid Request: not a JSON-RPC 2.0 message")


def error_body(error: mt.JSONRPCError) -> bytes:
    """The wire form of ``error``."""
    return error.model_dump_json(by_alias=True, exclude_unset=True).encode()


def _shape_problem(raw: Any) -> str | None:
    """What is wrong with the envelope, in one phrase (``None``: nothing obvious)."""
    if isinstance(raw, list):
        return "batches are not supported; send one JSON-RPC message at a time"
    if not isinstance(raw, dict):
        return f"a JSON-RPC message is a JSON object, not {_json_type(raw)}"
    if raw.get("jsonrpc") != "2.0":
        return "'jsonrpc' must be \"2.0\""
    if "id" in raw and (isinstance(raw["id"], bool) or not isinstance(raw["id"], (int, str))):
        return "'id' must be a string or an integer"
    if "method" in raw:
        if not isinstance(raw["method"], str):
            return "'method' must be a string"
        if "params" in raw and raw["params"] is not None and not isinstance(raw["params"], dict):
            return "'params' must be an object"
        return None
    if "result" not in raw and "error" not in raw:
        return "it has no 'method' (request, notification) nor 'result' or 'error' (response)"
    return None


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "a string"
    return type(value).__name__


def _error(ident: int | str | None, code: int, message: str) -> mt.JSONRPCError:
    return mt.JSONRPCError(jsonrpc="2.0", id=ident, error=mt.ErrorData(code=code, message=message))
