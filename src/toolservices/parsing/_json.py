"""The one JSON-decoding policy every parser family shares.

Models write a call's arguments in three ways:

* a JSON object (the norm): used as is;
* a JSON *string* that holds a JSON object (``"arguments": "{\\"a\\": 1}"``,
  what OpenAI-style chat APIs produce and what some fine-tunes imitate):
  decoded **once**, never recursively;
* something else (a plain string, a number, a list): rejected with a message
  that says arguments must be an object of parameter names to values.

``null`` and empty or blank text mean "no arguments" (``{}``). Decoding
failures are :class:`ArgumentsError`; parsers turn them into
:class:`~toolservices.parsing.ParseFailure` with the family's syntax appended.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

__all__ = [
    "ArgumentsError",
    "NestingError",
    "arguments_from_text",
    "call_from_object",
    "decode_arguments",
    "describe",
    "dumps",
    "json_problem",
    "loads",
    "raw_decode",
    "scan_once",
]

_DECODER = json.JSONDecoder()
#: The decoder's own scanner: ``scan_once(text, pos) -> (value, end)`` for the JSON
#: value that starts exactly at ``pos`` (no blanks skipped); StopIteration when no
#: value starts there, JSONDecodeError when one is malformed.
# (JSONDecoder sets it in __init__; typeshed does not declare it.)
scan_once: Callable[[str, int], tuple[Any, int]] = _DECODER.scan_once  # type: ignore[attr-defined]
_WHITESPACE = " \t\n\r"
_JSON_STARTS = frozenset('{["-0123456789tfnNI')
_BLANK_TAIL = re.compile(r"\s*\Z")


class ArgumentsError(ValueError):
    """Arguments or a call object that cannot be used; the text is for the model.

    ``truncated`` is true when the text stopped before the call was complete
    (the generation most likely hit its length limit); ``kind`` becomes the
    :attr:`ParseFailure.kind <toolservices.parsing.ParseFailure.kind>` label.
    """

    def __init__(
        self, message: str, *, truncated: bool = False, kind: str = "invalid_json"
    ) -> None:
        super().__init__(message)
        self.message = message
        self.truncated = truncated
        self.kind = "truncated" if truncated else kind


class NestingError(ArgumentsError):
    """JSON nested deeper than the decoder can follow (hostile or broken output)."""


def dumps(value: Any) -> str:
    """Compact-but-readable JSON as models write it (unicode kept as is)."""
    return json.dumps(value, ensure_ascii=False)


def describe(value: Any) -> str:
    """``a string 'abc'`` / ``a list`` ...: what the model wrote, briefly."""
    kinds = {str: "a string", list: "a list", bool: "a boolean", int: "a number", float: "a number"}
    kind = kinds.get(type(value), type(value).__name__)
    shown = dumps(value) if not isinstance(value, str) else repr(value)
    if len(shown) > 40:
        shown = shown[:37] + "..."
    return f"{kind} {shown}"


def json_problem(error: json.JSONDecodeError, text: str) -> ArgumentsError:
    """A model-readable description of a JSON syntax error in ``text``."""
    # "Only blanks after the error": a match at the error, not a copy of the text.
    truncated = _BLANK_TAIL.match(text, error.pos) is not None or error.msg.startswith(
        "Unterminated string"
    )
    if truncated:
        return ArgumentsError(
            "the JSON ends before all its brackets and quotes are closed", truncated=True
        )
    start = max(0, error.pos - 15)
    near = text[start : error.pos + 15].replace("\n", "\\n")
    return ArgumentsError(f"invalid JSON: {error.msg} (char {error.pos}, near {near!r})")


def loads(text: str) -> Any:
    """``json.loads`` raising :class:`ArgumentsError` with a readable message."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as error:
        raise json_problem(error, text) from None
    except RecursionError:
        raise NestingError("invalid JSON: nested too deeply") from None


def raw_decode(text: str, pos: int = 0) -> tuple[Any, int]:
    """Decode one JSON value starting at ``pos`` (after blanks); return it and its end."""
    while pos < len(text) and text[pos] in _WHITESPACE:
        pos += 1
    if pos >= len(text):
        raise ArgumentsError("the JSON value is missing (truncated?)", truncated=True)
    if text[pos] not in _JSON_STARTS:  # fail fast, without the decoder's error bookkeeping
        near = text[pos : pos + 20].replace("\n", "\\n")
        raise ArgumentsError(f"invalid JSON: expected a JSON value, found {near!r}")
    try:
        # The decoder's own scanner (what ``JSONDecoder.raw_decode`` calls), one
        # Python frame fewer; it raises StopIteration where raw_decode says
        # "Expecting value", and so do we.
        value, end = scan_once(text, pos)
    except StopIteration as stop:
        error = json.JSONDecodeError("Expecting value", text, stop.value)
        raise json_problem(error, text) from None
    except json.JSONDecodeError as error:
        raise json_problem(error, text) from None
    except RecursionError:
        raise NestingError("invalid JSON: nested too deeply") from None
    return value, end


def decode_arguments(value: Any) -> dict[str, Any]:
    """Apply the policy above to one call's arguments."""
    if value is None:
        return {}
    if isinstance(value, dict):
        return value
    if isinstance(value, str):
        stripped = value.strip()
        if not stripped:
            return {}
        try:
            decoded = json.loads(stripped)
        except json.JSONDecodeError as error:
            problem = json_problem(error, stripped)
            if stripped[0] not in "{[":
                problem = ArgumentsError(
                    "arguments must be a JSON object of parameter names to values, "
                    f"got {describe(value)}"
                )
            raise problem from None
        except RecursionError:
            raise NestingError("invalid JSON: nested too deeply") from None
        if isinstance(decoded, dict):
            return decoded
        if decoded is None:
            return {}
        value = decoded
    raise ArgumentsError(
        f"arguments must be a JSON object of parameter names to values, got {describe(value)}"
    )


def arguments_from_text(text: str) -> dict[str, Any]:
    """Arguments written as JSON text (a call body): parse it, then apply the policy.

    So a body that is a JSON string holding JSON is decoded once more, like an
    ``"arguments"`` value would be; blank text means ``{}``.
    """
    if not text.strip():
        return {}
    return decode_arguments(loads(text.strip()))


def call_from_object(
    obj: Any,
    *,
    args_keys: Sequence[str] = ("arguments", "parameters"),
) -> tuple[str, dict[str, Any], str]:
    """``(name, args, id)`` from a call object such as ``{"name", "arguments"}``.

    Also reads the OpenAI shape ``{"type": "function", "function": {...}, "id"}``.
    The id is ``""`` when the object carries none.
    """
    # ``type(...) is`` first: decoded JSON is plain dicts and strs, and the ABC
    # check costs more than the rest of a small call.
    if type(obj) is not dict and not isinstance(obj, Mapping):
        raise ArgumentsError(
            f"each tool call must be a JSON object, got {describe(obj)}", kind="invalid_syntax"
        )
    call_id = obj.get("id")
    inner = obj.get("function")
    if inner is not None and isinstance(inner, Mapping) and "name" in inner:
        obj = inner
    name = obj.get("name")
    if not isinstance(name, str) or not name.strip():
        keys = ", ".join(map(repr, obj)) or "none"
        raise ArgumentsError(
            f'the call object needs a string "name" (keys found: {keys})', kind="invalid_syntax"
        )
    raw_args: Any = None
    for key in args_keys:
        if key in obj:
            raw_args = obj[key]
            break
    if type(raw_args) is dict:  # the usual case: decode_arguments would return it as is
        return name.strip(), raw_args, call_id if isinstance(call_id, str) else ""
    try:
        args = decode_arguments(raw_args)
    except ArgumentsError as error:
        raise ArgumentsError(
            f"tool {name!r}: {error.message}", truncated=error.truncated, kind=error.kind
        ) from None
    return name.strip(), args, call_id if isinstance(call_id, str) else ""
