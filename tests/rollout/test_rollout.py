"""Rollouts with the real openai SDK against a real HTTP chat server on loopback.

The server (``toolservices.rollout.testing``) replays scripted assistant
turns: raw text in several model families' own syntax (parsed here), or
``tool_calls`` a server parsed; and it injects transient faults (503, 429,
answers that hang past the request timeout) and permanent ones (400).
"""

from __future__ import annotations

import json
from typing import Any

import anyio
import openai
import pytest
from tests._chat import hermes, server_call

from toolservices import UserError, tool
from toolservices.cli._demo_data import FORMAT_TURNS, SCENARIOS
from toolservices.cli._demo_tools import DEMO_TOOLS
from toolservices.rollout import RetryPolicy, Rollout, Trajectory
from toolservices.rollout.testing import Fail, Hang, Raw, ScriptedChatServer, toy_tokenize

#: Fast retries for tests (the backoff itself is not what is tested here).
FAST = RetryPolicy(max_attempts=4, backoff=0.01, max_backoff=0.05)


def calc(expression: str) -> str:
    return hermes("calculator", {"expression": expression})


def tool_texts(trajectory: Trajectory) -> str:
    return "\n".join(m["content"] for m in trajectory.messages if m["role"] == "tool")


async def run(server: ScriptedChatServer, prompts: list[str], **options: Any) -> list[Trajectory]:
    options.setdefault("retry", FAST)
    async with Rollout(DEMO_TOOLS, model="scripted", base_url=server.url, **options) as runner:
        return await runner.arun(prompts)


# -- what comes back -------------------------------------------------------------------------


async def test_server_parsed_tool_calls_are_run_and_answered() -> None:
    script = {
        "Weather?": [
            {
                "content": "Looking it up.",
                "tool_calls": [
                    server_call("call_p", "get_weather", {"city": "Paris"}),
                    server_call("call_t", "get_weather", {"city": "Tokyo"}),
                ],
            },
            {"tool_calls": [server_call("call_c", "calculator", {"expression": "18 + 24"})]},
            "Paris is cloudy, Tokyo sunny; 42 degrees together.",
        ]
    }
    with ScriptedChatServer(script) as server:
        (trajectory,) = await run(server, ["Weather?"], parser=None)
    assert trajectory.ok and trajectory.finish_reason == "answered", trajectory.error
    assert [t.finish_reason for t in trajectory.turns] == ["tool_calls", "tool_calls", "stop"]
    assert [m["role"] for m in trajectory.messages] == [
        "user", "assistant", "tool", "tool", "assistant", "tool", "assistant"
    ]  # fmt: skip
    first = trajectory.messages[1]
    assert first["content"] == "Looking it up."
    assert [c["id"] for c in first["tool_calls"]] == ["call_p", "call_t"]
    assert [m["tool_call_id"] for m in trajectory.messages[2:4]] == ["call_p", "call_t"]
    assert "cloudy" in trajectory.messages[2]["content"]
    assert "sunny" in trajectory.messages[3]["content"]
    assert trajectory.messages[5]["content"] == "42"
    assert trajectory.turns[0].tool_messages == trajectory.messages[2:4]
    assert trajectory.metrics.calls == 3 and trajectory.metrics.failed_calls == 0
    assert trajectory.metrics.turns == 3 and trajectory.requests == 3 and trajectory.retries == 0
    # Every request carried the tools' specs and the conversation so far.
    assert len(server.requests) == 3
    names = {spec["function"]["name"] for spec in server.requests[0]["tools"]}
    assert names == {t.name for t in DEMO_TOOLS}
    assert server.requests[2]["messages"] == trajectory.messages[:6]
    assert json.loads(json.dumps(trajectory.to_dict()))["finish_reason"] == "answered"


@pytest.mark.parametrize("fmt", ["hermes", "llama3_json", "mistral", "qwen3_coder", "pythonic"])
async def test_raw_text_is_parsed_client_side(fmt: str) -> None:
    """The demo's scenarios in each family's own syntax, malformed first turn included."""
    script = {s.prompt: turns for s, turns in zip(SCENARIOS, FORMAT_TURNS[fmt], strict=True)}
    with ScriptedChatServer(script) as server:
        trajectories = await run(server, list(script), parser=fmt, max_turns=4)
    for scenario, trajectory in zip(SCENARIOS, trajectories, strict=True):
        assert trajectory.finish_reason == "answered", (scenario.name, trajectory.error)
        ok_text = "\n".join(
            m["content"]
            for m in trajectory.messages
            if m["role"] == "tool" and not m["content"].startswith("Error:")
        )
        for expected in scenario.expect:
            assert expected in ok_text, (fmt, scenario.name)
        first = trajectory.turns[0].metrics
        assert (not first.clean) == scenario.first_turn_fails, (fmt, scenario.name)
        # The assistant turn goes back to the server with the calls as tool_calls.
        if not scenario.first_turn_fails:
            assert trajectory.messages[1]["tool_calls"]


async def test_parser_none_never_parses_text() -> None:
    """Without a parser only the server's tool_calls count: call syntax in text is just text."""
    with ScriptedChatServer({"q": [calc("1 + 1")]}) as server:
        (trajectory,) = await run(server, ["q"], parser=None)
    assert trajectory.finish_reason == "answered"
    assert trajectory.metrics.calls == 0 and len(trajectory.turns) == 1
    assert trajectory.messages[-1] == {"role": "assistant", "content": calc("1 + 1")}


async def test_turn_limit_ends_the_episode() -> None:
    with ScriptedChatServer({"loop": [calc(f"{i} + 1") for i in range(5)]}) as server:
        (trajectory,) = await run(server, ["loop"], parser="hermes", max_turns=2)
    assert trajectory.finish_reason == "max_turns"
    assert len(trajectory.turns) == 2 and len(server.requests) == 2
    assert trajectory.messages[-1] == {
        "role": "tool",
        "tool_call_id": trajectory.messages[-2]["tool_calls"][0]["id"],
        "name": "calculator",
        "content": "2",
    }


async def test_token_ids_and_logprobs_are_requested_and_kept() -> None:
    turns = [calc("6 * 7"), "It is 42."]
    with ScriptedChatServer({"q": turns}) as server:
        (trajectory,) = await run(server, ["q"], parser="hermes", logprobs=2, return_token_ids=True)
        plain = await run(server, ["q"], parser="hermes")
    assert trajectory.finish_reason == "answered"
    for turn, text in zip(trajectory.turns, turns, strict=True):
        tokens, ids = toy_tokenize(text)
        assert turn.tokens == tokens and turn.completion_token_ids == ids
        assert turn.logprobs is not None and len(turn.logprobs) == len(ids)
        assert all(lp < 0 for lp in turn.logprobs)
        assert turn.top_logprobs is not None and all(len(t) >= 1 for t in turn.top_logprobs)
        assert turn.prompt_token_ids and turn.usage is not None
        assert turn.usage["prompt_tokens"] == len(turn.prompt_token_ids)
    # The second prompt holds the first turn and its tool result: it is longer.
    first, second = trajectory.turns
    assert first.prompt_token_ids is not None and second.prompt_token_ids is not None
    assert len(second.prompt_token_ids) > len(first.prompt_token_ids)
    asked = server.requests[0]
    assert asked["logprobs"] is True and asked["top_logprobs"] == 2
    assert asked["return_token_ids"] is True
    # Not asked, not sent, not there.
    assert not {"logprobs", "top_logprobs", "return_token_ids"} & set(server.requests[-1])
    (turn, _) = plain[0].turns
    assert turn.completion_token_ids is None and turn.logprobs is None and turn.tokens is None


async def test_request_options_reach_the_server() -> None:
    options = {
        "temperature": 0.7,
        "max_tokens": 64,
        "extra_body": {"top_k": 5, "chat_template_kwargs": {"enable_thinking": False}},
        "extra_headers": {"X-Trace": "1"},
    }
    with ScriptedChatServer({"q": ["fine"]}) as server:
        await run(server, ["q"], request_options=options, return_token_ids=True, send_tools=False)
    (body,) = server.requests
    assert body["temperature"] == 0.7 and body["max_tokens"] == 64 and body["top_k"] == 5
    assert body["chat_template_kwargs"] == {"enable_thinking": False}
    assert body["return_token_ids"] is True and body["model"] == "scripted"
    assert "tools" not in body and "extra_body" not in body and "extra_headers" not in body


# -- faults ----------------------------------------------------------------------------------


async def test_transient_errors_are_retried() -> None:
    script = {
        "503": [Fail(status=503, times=2, then=calc("2 ** 3")), "8."],
        "429": [Fail(status=429, retry_after=0.0, then="fine.")],
        "502": [Fail(status=502, then=Fail(status=500, times=2, then="ok."))],
    }
    with ScriptedChatServer(script) as server:
        by_prompt = dict(zip(script, await run(server, list(script), parser="hermes"), strict=True))
    flaky = by_prompt["503"]
    assert flaky.finish_reason == "answered", flaky.error
    assert [t.attempts for t in flaky.turns] == [3, 1]
    assert flaky.requests == 4 and flaky.retries == 2
    assert "8" in tool_texts(flaky)
    assert server.attempts[("503", 0)] == 3
    assert by_prompt["429"].turns[0].attempts == 2 and by_prompt["429"].ok
    assert by_prompt["502"].turns[0].attempts == 3 and by_prompt["502"].ok


async def test_a_hanging_answer_times_out_and_is_retried() -> None:
    with ScriptedChatServer({"slow": [Hang(then=calc("5 - 3")), "2."]}) as server:
        (trajectory,) = await run(server, ["slow"], parser="hermes", request_timeout=1.0)
    assert trajectory.finish_reason == "answered", trajectory.error
    assert trajectory.turns[0].attempts == 2
    assert trajectory.turns[0].request_time >= 1.0
    assert server.attempts[("slow", 0)] == 2


async def test_retries_are_bounded() -> None:
    with ScriptedChatServer({"down": [Fail(status=503, times=None)]}) as server:
        (trajectory,) = await run(server, ["down"], retry=RetryPolicy(max_attempts=3, backoff=0.01))
    assert trajectory.finish_reason == "request_error" and not trajectory.ok
    assert trajectory.error is not None
    assert trajectory.error.startswith("gave up after 3 attempt(s)")
    assert "HTTP 503" in trajectory.error
    assert server.attempts[("down", 0)] == 3
    assert trajectory.requests == 3 and trajectory.retries == 2 and trajectory.turns == []


async def test_a_clients_own_sdk_retries_are_turned_off() -> None:
    """Retries are the rollout's, bounded by its policy, never multiplied by the SDK's."""
    with ScriptedChatServer({"down": [Fail(status=503, times=None)]}) as server:
        client = openai.AsyncOpenAI(base_url=server.url, api_key="k", max_retries=5)
        async with Rollout(
            DEMO_TOOLS, model="m", client=client, retry=RetryPolicy(max_attempts=2, backoff=0)
        ) as runner:
            (trajectory,) = await runner.arun(["down"])
        await client.close()
    assert trajectory.finish_reason == "request_error"
    assert server.attempts[("down", 0)] == 2


async def test_a_failing_episode_does_not_affect_the_others() -> None:
    script: dict[str, list[Any]] = {f"ok {i}": [calc(f"{i} * 2"), "done"] for i in range(6)}
    script["rejected"] = [calc("1 + 1"), Fail(status=400, times=None, message="context too long")]
    with ScriptedChatServer(script) as server:
        trajectories = await run(server, list(script), parser="hermes", max_concurrency=3)
    *good, rejected = trajectories
    for i, trajectory in enumerate(good):
        assert trajectory.finish_reason == "answered" and trajectory.index == i
        assert tool_texts(trajectory) == str(i * 2)
    assert rejected.finish_reason == "request_error"
    assert rejected.error == "HTTP 400: context too long"
    # Not transient: no retry. The turn before the failure is kept.
    assert server.attempts[("rejected", 1)] == 1 and rejected.requests == 2
    assert len(rejected.turns) == 1 and rejected.metrics.calls == 1
    assert rejected.messages[-1]["role"] == "tool"


async def test_unreachable_server_ends_each_episode_with_a_reason() -> None:
    with ScriptedChatServer({}) as server:
        url = server.url  # a port that nobody listens on once the server is closed
    runner = Rollout(
        DEMO_TOOLS, model="m", base_url=url, retry=RetryPolicy(max_attempts=2, backoff=0)
    )
    async with runner:
        trajectories = await runner.arun(["a", "b"])
    for trajectory in trajectories:
        assert trajectory.finish_reason == "request_error"
        assert trajectory.error is not None and "connection error" in trajectory.error
        assert trajectory.requests == 2


async def test_concurrency_limit_holds_and_is_reached() -> None:
    """The server holds the first requests until three are in flight: never more arrive."""
    script = {f"p{i}": [calc(f"{i} + 0"), "done"] for i in range(12)}
    with ScriptedChatServer(script, hold_until_in_flight=3, latency=0.01) as server:
        trajectories = await run(server, list(script), parser="hermes", max_concurrency=3)
    assert all(t.finish_reason == "answered" for t in trajectories)
    assert server.max_in_flight == 3
    assert len(server.requests) == 24


async def test_episodes_overlap_their_tools() -> None:
    """Eight episodes whose tool waits for all eight: only concurrent episodes finish."""
    arrived = 0
    everyone = anyio.Event()

    @tool
    async def rendezvous() -> str:
        """Wait until eight calls are running at once."""
        nonlocal arrived
        arrived += 1
        if arrived == 8:
            everyone.set()
        with anyio.fail_after(30):
            await everyone.wait()
        return "met"

    script = {f"r{i}": [hermes("rendezvous", {}), "done"] for i in range(8)}
    with ScriptedChatServer(script) as server:
        async with Rollout(
            [rendezvous], model="m", base_url=server.url, parser="hermes", max_concurrency=8
        ) as runner:
            trajectories = await runner.arun(list(script))
    assert [tool_texts(t) for t in trajectories] == ["met"] * 8


async def test_each_episode_runs_python_in_its_own_session() -> None:
    from toolservices import python_tool
    from toolservices.python import PythonExecutorService

    def code(source: str) -> str:
        return hermes("python", {"code": source})

    script = {f"e{i}": [code(f"x = {i} * 10"), code("print(x + 1)"), "done"] for i in range(3)}
    executor = PythonExecutorService(pool_size=2, timeout=10.0)
    try:
        with ScriptedChatServer(script) as server:
            async with Rollout(
                [python_tool(executor)], model="m", base_url=server.url, parser="hermes"
            ) as runner:
                trajectories = await runner.arun(list(script))
        for i, trajectory in enumerate(trajectories):
            assert trajectory.finish_reason == "answered", trajectory.error
            assert trajectory.turns[1].tool_messages[0]["content"].strip() == str(i * 10 + 1)
        # The sessions were closed with their episodes.
        assert executor.stats()["sessions"] == 0
    finally:
        await executor.aclose()


def test_sync_run_and_states() -> None:
    seen: list[Any] = []

    @tool
    def remember(_state: dict) -> str:
        """Record the episode's state, and write to it."""
        seen.append(_state["answer"])
        _state["noted"] = _state["answer"] * 10
        return "noted"

    script = {"a": [hermes("remember", {}), "ok"], "b": [hermes("remember", {}), "ok"]}
    with ScriptedChatServer(script) as server:
        with Rollout([remember], model="m", base_url=server.url, parser="hermes") as runner:
            trajectories = runner.run(["a", "b"], states=[{"answer": 1}, {"answer": 2}])
        assert runner.client.is_closed()
    assert sorted(seen) == [1, 2]
    assert [t.state for t in trajectories] == [
        {"answer": 1, "noted": 10},
        {"answer": 2, "noted": 20},
    ]


# -- developer errors ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("options", "match"),
    [
        ({"model": ""}, "model="),
        ({"parser": "no-such-format"}, "no-such-format"),
        ({"max_concurrency": 0}, "max_concurrency"),
        ({"max_failed_turns": 0}, "max_failed_turns"),
        ({"request_timeout": 0}, "request_timeout"),
        ({"request_options": {"messages": []}}, "request_options may not set"),
        ({"request_options": {"extra_body": {"stream": True}}}, "may not set"),
        ({"client": object(), "base_url": "http://x"}, "either client="),
    ],
)
def test_bad_configuration_is_a_user_error(options: dict[str, Any], match: str) -> None:
    options = {"model": "m", "base_url": "http://127.0.0.1:9/v1", **options}
    with pytest.raises(UserError, match=match):
        Rollout(DEMO_TOOLS, **options)
    with pytest.raises(UserError, match="max_attempts"):
        RetryPolicy(max_attempts=0)


async def test_bad_prompts_are_a_user_error_before_any_request() -> None:
    with ScriptedChatServer({"a": ["hi"]}) as server:
        async with Rollout(DEMO_TOOLS, model="m", base_url=server.url) as runner:
            with pytest.raises(UserError, match=r"prompts\[1\] must be"):
                await runner.arun(["a", 42])  # type: ignore[list-item]
            with pytest.raises(UserError, match="2 states for 1 prompts"):
                await runner.arun(["a"], states=[{}, {}])
    assert server.requests == []


def test_server_answers_without_waiting_for_delayed_acks() -> None:
    """Regression: uvicorn writes headers and body apart; with Nagle on, every answer
    waited for the client's delayed ACK (~40 ms). Accepted sockets inherit TCP_NODELAY."""
    import socket

    with ScriptedChatServer({}) as server:
        assert server._socket is not None
        assert server._socket.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)


@pytest.mark.parametrize(
    ("raw", "error"),
    [
        (
            Raw(body="<html>Bad gateway page</html>", content_type="text/html"),
            "not a chat completion",
        ),
        (Raw(body='{"choices": [{"index": 0, "mess'), "not valid JSON"),
        (Raw(body={"id": "x", "object": "chat.completion", "choices": []}), "has no choices"),
        (Raw(body={"choices": [{"index": 0, "finish_reason": "stop"}]}), "has no message"),
        (Raw(body={"unexpected": True}), "has no choices"),
    ],
)
async def test_a_broken_answer_ends_only_its_episode(raw: Raw, error: str) -> None:
    """What proxies and half-compatible servers send: a clear reason, no retry, no crash."""
    script = {"broken": [raw], "fine": [calc("3 * 3"), "9."]}
    with ScriptedChatServer(script) as server:
        broken, fine = await run(server, list(script), parser="hermes")
    assert broken.finish_reason == "request_error" and broken.requests == 1
    assert broken.error is not None and error in broken.error, broken.error
    assert fine.finish_reason == "answered" and tool_texts(fine) == "9"


async def test_missing_token_fields_are_none_not_a_crash() -> None:
    """A server that sends logprobs entries without their fields (the SDK does not validate)."""
    body = {
        "id": "x",
        "object": "chat.completion",
        "model": "m",
        "prompt_token_ids": "not a list",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "ok"},
                "logprobs": {"content": [{"bytes": None}]},
                "token_ids": [1, "two"],
            }
        ],
    }
    with ScriptedChatServer({"q": [Raw(body=body)]}) as server:
        (trajectory,) = await run(server, ["q"], logprobs=0, return_token_ids=True)
    assert trajectory.finish_reason == "answered", trajectory.error
    (turn,) = trajectory.turns
    assert turn.prompt_token_ids is None and turn.completion_token_ids is None
    assert turn.tokens == [None] and turn.logprobs == [None] and turn.finish_reason is None


def test_backoff_grows_is_capped_jittered_and_honours_short_retry_after() -> None:
    policy = RetryPolicy(backoff=0.5, max_backoff=4.0)
    for retry, base in ((1, 0.5), (2, 1.0), (3, 2.0), (4, 4.0), (9, 4.0)):
        delays = [policy.delay(retry) for _ in range(50)]
        assert all(base * 0.5 <= d <= base for d in delays), (retry, min(delays), max(delays))
        assert len(set(delays)) > 1  # jittered: episodes do not retry in lockstep
    assert policy.delay(3, retry_after=0.25) == 0.25
    assert policy.delay(1, retry_after=60.0) <= 0.5  # a long Retry-After is not obeyed


async def test_the_test_server_streams_for_streaming_clients() -> None:
    """The SDK's own stream reader sees content deltas, tool calls and usage."""
    script = {
        "s": [
            {
                "content": "Let me add.",
                "tool_calls": [server_call("call_1", "calculator", {"expression": "1+2"})],
            }
        ]
    }
    with ScriptedChatServer(script) as server:
        client = openai.AsyncOpenAI(base_url=server.url, api_key="k", max_retries=0)
        stream = await client.chat.completions.create(
            model="m",
            messages=[{"role": "user", "content": "s"}],
            stream=True,
            stream_options={"include_usage": True},
        )
        chunks = [chunk async for chunk in stream]
        await client.close()
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == "Let me add."
    (call,) = [tc for c in chunks if c.choices for tc in c.choices[0].delta.tool_calls or []]
    assert call.id == "call_1" and call.function is not None
    assert call.function.name == "calculator"
    assert json.loads(call.function.arguments or "") == {"expression": "1+2"}
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "tool_calls"
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens > 0


async def test_concurrent_arun_calls_share_the_rollouts_max_concurrency() -> None:
    """Each arun used to make its own bound: two calls ran two episodes at once."""
    inside = 0
    peak = 0
    release = anyio.Event()

    @tool
    async def hold() -> str:
        """Waits until the test lets it go."""
        nonlocal inside, peak
        inside += 1
        peak = max(peak, inside)
        with anyio.fail_after(30):
            await release.wait()
        inside -= 1
        return "held"

    script = {p: [hermes("hold", {}), "done"] for p in ("a", "b")}
    with ScriptedChatServer(script) as server:
        async with (
            Rollout(
                [hold], model="m", base_url=server.url, parser="hermes", max_concurrency=1
            ) as runner,
            anyio.create_task_group() as tg,
        ):
            tg.start_soon(runner.arun, ["a"])
            tg.start_soon(runner.arun, ["b"])
            with anyio.fail_after(30):
                while inside == 0:  # noqa: ASYNC110 - yield until the first call is in
                    await anyio.sleep(0.01)
            assert runner._in_flight.held == 1
            with anyio.fail_after(30):
                while runner._in_flight.waiting == 0:  # noqa: ASYNC110 - until queued
                    await anyio.sleep(0.01)
            assert inside == 1
            release.set()
    assert peak == 1
