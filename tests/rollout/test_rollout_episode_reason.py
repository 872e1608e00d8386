"""The rollout driver on the Episode API: ``parser=None`` and the episode's own end reason."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tests._chat import hermes

from toolservices import Episode, tool
from toolservices.cli._demo_tools import DEMO_TOOLS
from toolservices.errors import ServiceUnavailableError
from toolservices.rollout import RetryPolicy, Rollout
from toolservices.rollout.testing import Fail, Raw, ScriptedChatServer

FAST = RetryPolicy(max_attempts=2, backoff=0.0)


class Recording(Rollout):
    """A rollout that keeps the episodes it starts (to look at their own state)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.episodes: list[Episode] = []

    def new_episode(self, prompt: Any, state: Mapping[str, Any] | None = None) -> Episode:
        episode = super().new_episode(prompt, state)
        self.episodes.append(episode)
        return episode


async def test_parser_none_answer_text_is_never_parsed() -> None:
    """Regression: the former private parser turned a lone surrogate in the answer's
    text into a parse error (a failed turn, then another request)."""
    # sent as the JSON escape "\\ud800": a lone surrogate once decoded
    body = (
        '{"id": "c1", "object": "chat.completion", "created": 0, "model": "m", "choices": '
        '[{"index": 0, "finish_reason": "stop", "message": {"role": "assistant", '
        '"content": "half a pair: \\ud800, the answer is 4"}}]}'
    )
    script = {"a": [Raw(body=body)]}
    with ScriptedChatServer(script) as server:
        async with Recording(
            DEMO_TOOLS, model="m", base_url=server.url, retry=FAST, parser=None
        ) as runner:
            (trajectory,) = await runner.arun(["a"])
    assert trajectory.finish_reason == "answered", trajectory.error
    assert trajectory.requests == 1 and trajectory.metrics.parse_errors == 0
    (episode,) = runner.episodes
    assert episode.parser.name == "server"


async def test_a_request_error_is_the_episodes_reason() -> None:
    script = {"down": [Fail(status=400, times=None, message="context too long")], "up": ["hi"]}
    with ScriptedChatServer(script) as server:
        async with Recording(DEMO_TOOLS, model="m", base_url=server.url, retry=FAST) as runner:
            down, up = await runner.arun(["down", "up"])
    assert down.finish_reason == "request_error" and "context too long" in (down.error or "")
    assert up.finish_reason == "answered"
    by_id = {e.id: e for e in runner.episodes}
    assert by_id[down.episode_id].reason == "request_error" and by_id[down.episode_id].closed
    assert by_id[up.episode_id].reason == "answered" and by_id[up.episode_id].closed


async def test_a_session_close_failure_after_the_answer_keeps_the_episodes_reason() -> None:
    """Fault injection: an executor whose session release fails (cannot happen on demand).

    The trajectory reports the failure; the episode did answer, and says so.
    """

    class BrokenExecutor:
        async def aclose_session(self, session_id: str) -> bool:
            raise ServiceUnavailableError("the interpreter host is gone")

    with ScriptedChatServer({"a": ["hi"]}) as server:
        async with Recording(
            DEMO_TOOLS,
            model="m",
            base_url=server.url,
            python=BrokenExecutor(),
        ) as runner:
            (trajectory,) = await runner.arun(["a"])
    assert trajectory.finish_reason == "infrastructure_error"
    assert trajectory.error == "ServiceUnavailableError: the interpreter host is gone"
    assert len(trajectory.turns) == 1 and trajectory.messages[-1]["content"] == "hi"
    (episode,) = runner.episodes
    assert episode.reason == "answered" and episode.closed


async def test_a_tool_backend_failure_is_a_failed_call_the_model_reads() -> None:
    """What docs/rollout.md says: an InfrastructureError from a tool during a call does
    not end the episode; the model reads it and answers."""

    @tool
    def flaky() -> str:
        """Needs a backend that is down."""
        raise ServiceUnavailableError("the backend is down", retryable=True)

    script = {"a": [hermes("flaky", {}), "I could not reach it."]}
    with ScriptedChatServer(script) as server:
        async with Rollout([flaky], model="m", base_url=server.url, parser="hermes") as runner:
            (trajectory,) = await runner.arun(["a"])
    assert trajectory.finish_reason == "answered" and trajectory.ok
    assert trajectory.metrics.failed_calls == 1
    (tool_message,) = trajectory.turns[0].tool_messages
    assert "the backend is down" in tool_message["content"]
