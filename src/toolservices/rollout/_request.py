"""One chat-completions request with bounded retries, and reading its answer.

Transient failures (HTTP 408, 409, 429 and 5xx, connection errors,
timeouts) are retried with exponential backoff and jitter, honouring a
short ``Retry-After``; anything else (a 400 for a bad request, a 401, a
malformed answer) ends the request at once with a readable reason. Nothing
here raises for what the server did: the caller gets a :class:`Answer`.
"""

from __future__ import annotations

import json
import random
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import anyio

from toolservices.errors import UserError

__all__ = ["Answer", "RetryPolicy", "request_completion"]

#: Statuses a server uses for "try again later".
TRANSIENT_STATUSES = frozenset({408, 409, 429})


@dataclass(frozen=True, kw_only=True)
class RetryPolicy:
    """How often and how patiently a failed request is tried again.

    The n-th retry waits ``min(max_backoff, backoff * 2**(n-1))`` seconds,
    scaled by a random factor in [0.5, 1] so that many episodes hit by the
    same outage do not come back in lockstep. A ``Retry-After`` header from
    the server wins when it asks for no more than ``max_backoff``.
    """

    #: Attempts per request, the first included (1 disables retries).
    max_attempts: int = 4
    backoff: float = 0.5
    max_backoff: float = 8.0

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise UserError(f"RetryPolicy.max_attempts must be at least 1, got {self.max_attempts}")
        if self.backoff < 0 or self.max_backoff < 0:
            raise UserError("RetryPolicy.backoff and max_backoff must not be negative")

    def delay(self, retry: int, *, retry_after: float | None = None) -> float:
        """Seconds to wait before retry number ``retry`` (1-based)."""
        if retry_after is not None and 0 <= retry_after <= self.max_backoff:
            return retry_after
        base = min(self.max_backoff, self.backoff * 2.0 ** (retry - 1))
        return base * random.uniform(0.5, 1.0)


@dataclass(kw_only=True)
class Answer:
    """The outcome of one request: a completion, or why there is none."""

    completion: Any = None
    error: str | None = None
    attempts: int = 0
    elapsed: float = 0.0
    #: One line per failed attempt (for logs and tests).
    failures: list[str] = field(default_factory=list)


def _retry_after(exc: Exception) -> float | None:
    response = getattr(exc, "response", None)
    value = response.headers.get("retry-after") if response is not None else None
    try:
        return float(value) if value is not None else None
    except ValueError:
        return None


def classify(exc: BaseException, timeout: float) -> tuple[bool, str]:
    """(transient?, reason) for an exception raised by one attempt."""
    import openai

    if isinstance(exc, TimeoutError | openai.APITimeoutError):
        return True, f"no answer within the request timeout ({timeout:g} s)"
    if isinstance(exc, openai.APIConnectionError):
        cause = exc.__cause__ or exc
        return True, f"connection error: {type(cause).__name__}: {cause}"
    if isinstance(exc, openai.APIStatusError):
        status = exc.status_code
        transient = status in TRANSIENT_STATUSES or status >= 500
        body = exc.body
        detail = body.get("message") if isinstance(body, dict) else None
        return transient, f"HTTP {status}: {detail if isinstance(detail, str) else exc.message}"
    return False, f"{type(exc).__name__}: {exc}"


async def request_completion(
    client: Any,
    *,
    messages: Sequence[Mapping[str, Any]],
    body: Mapping[str, Any],
    options: Mapping[str, Any],
    request_timeout: float,
    retry: RetryPolicy,
) -> Answer:
    """POST ``/chat/completions`` with retries; never raises for the server's doing.

    ``body`` holds every request field but ``messages``, already JSON-ready;
    ``options`` are the SDK's request options (``headers``, ``params``). The
    SDK's generic ``post`` is used rather than ``chat.completions.create``,
    which walks every request's messages and tool schemas through its typed
    transform first: about 1 ms of CPU a request in our benchmark, a third
    of the client's cost per turn, for fields that are plain JSON already.
    """
    import openai
    from openai.types.chat import ChatCompletion

    answer = Answer()
    started = time.perf_counter()
    while True:
        answer.attempts += 1
        try:
            # The SDK's timeout bounds each phase (connect, read...); this
            # bounds the whole attempt, so a trickling answer cannot stall it.
            with anyio.fail_after(request_timeout):
                completion = await client.post(
                    "/chat/completions",
                    body={**body, "messages": list(messages)},
                    cast_to=ChatCompletion,
                    options={**options, "timeout": request_timeout},
                )
        except json.JSONDecodeError as exc:  # a 2xx body that is not JSON
            answer.failures.append(f"invalid JSON: {exc}")
            answer.error = f"the server's answer is not valid JSON ({exc})"
            break
        except (TimeoutError, openai.OpenAIError) as exc:
            transient, reason = classify(exc, request_timeout)
            answer.failures.append(reason)
            if not transient:
                answer.error = reason
                break
            if answer.attempts >= retry.max_attempts:
                answer.error = f"gave up after {answer.attempts} attempt(s); last: {reason}"
                break
            await anyio.sleep(retry.delay(answer.attempts, retry_after=_retry_after(exc)))
            continue
        problem = malformed(completion)
        if problem is not None:
            answer.failures.append(problem)
            answer.error = problem
            break
        answer.completion = completion
        break
    answer.elapsed = time.perf_counter() - started
    return answer


def malformed(completion: Any) -> str | None:
    """Why ``completion`` is not a usable chat completion, or ``None``.

    The SDK builds its models without validation, and hands back the text
    of a non-JSON answer (a proxy's HTML page) as a plain string.
    """
    from openai.types.chat import ChatCompletion

    if not isinstance(completion, ChatCompletion):
        text = str(completion)[:120]
        return f"the server's answer is not a chat completion: {text!r}"
    choices = completion.choices
    if not isinstance(choices, list) or not choices:
        return "the server's answer has no choices"
    message = getattr(choices[0], "message", None)
    if message is None or not hasattr(message, "model_dump"):
        return "the server's first choice has no message"
    return None


def assistant_message(choice: Any) -> dict[str, Any]:
    """The choice's message as a plain dict (``None`` fields dropped, extras kept)."""
    message: dict[str, Any] = choice.message.model_dump(exclude_none=True)
    message["role"] = "assistant"
    message.setdefault("content", None)
    if not message.get("tool_calls"):
        message.pop("tool_calls", None)
    return message


def token_details(completion: Any) -> dict[str, Any]:
    """Token ids, log-probabilities and usage, where the server sent them.

    Read defensively: the SDK does not validate answers, and servers differ
    in which of these fields they fill.
    """
    choice = completion.choices[0]
    extra = completion.model_extra or {}
    choice_extra = choice.model_extra or {}
    usage: Any = getattr(completion, "usage", None)
    details: dict[str, Any] = {
        "prompt_token_ids": _ints(extra.get("prompt_token_ids")),
        "completion_token_ids": _ints(choice_extra.get("token_ids")),
        "usage": usage.model_dump(exclude_none=True) if hasattr(usage, "model_dump") else None,
    }
    content = getattr(getattr(choice, "logprobs", None), "content", None)
    if isinstance(content, list) and content:
        details["tokens"] = [getattr(entry, "token", None) for entry in content]
        details["logprobs"] = [getattr(entry, "logprob", None) for entry in content]
        tops = [getattr(entry, "top_logprobs", None) or [] for entry in content]
        if any(tops):
            details["top_logprobs"] = [
                {getattr(t, "token", ""): getattr(t, "logprob", None) for t in top} for top in tops
            ]
    return details


def _ints(value: Any) -> list[int] | None:
    if isinstance(value, list) and all(isinstance(v, int) for v in value):
        return value
    return None
