"""One Python tool with a render choice: episodes, TorchRL's PythonInterpreter and the MCP
server's python_execute are the same class (issue 16)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from toolservices import Dispatcher, Episode, PythonExecutorService, ToolCall, ToolRegistry
from toolservices.env import PythonTool, python_tool
from toolservices.errors import UserError


@pytest.fixture(scope="module")
def executor() -> Iterator[PythonExecutorService]:
    svc = PythonExecutorService(pool_size=2, timeout=3.0)
    try:
        yield svc
    finally:
        svc.close()


CODE = "import sys\nprint('out')\nprint('err', file=sys.stderr)"


async def test_each_render_reads_as_documented(executor: PythonExecutorService) -> None:
    tools = [
        python_tool(executor, name="as_text"),
        python_tool(executor, name="as_stdout", render="stdout"),
        python_tool(executor, name="as_result", render="result"),
    ]
    dispatcher = Dispatcher(ToolRegistry(tools))
    (outcome,) = await dispatcher.arun(
        [
            [ToolCall(t.name, {"code": CODE}) for t in tools]
            + [ToolCall("as_result", {"code": "1/0"})]
        ]
    )
    text, stdout, result, failed = outcome.results
    assert text.value == "out\n[stderr]\nerr\n"
    assert stdout.value == "out\n"
    assert result.value["success"] and result.value["stdout"] == "out\n"
    assert result.value["stderr"] == "err\n"
    # with render="result" a failed run is a result the model reads, not a failed call
    assert (
        failed.ok and not failed.value["success"] and "ZeroDivisionError" in failed.value["stderr"]
    )


async def test_text_and_stdout_renders_fail_the_call_on_an_error(
    executor: PythonExecutorService,
) -> None:
    tools = [python_tool(executor, name="a"), python_tool(executor, name="b", render="stdout")]
    (outcome,) = await Dispatcher(ToolRegistry(tools)).arun(
        [[ToolCall("a", {"code": "1/0"}), ToolCall("b", {"code": "1/0"})]]
    )
    assert [r.ok for r in outcome.results] == [False, False]
    assert all("ZeroDivisionError" in (r.error or "") for r in outcome.results)


async def test_sessions_from_the_model_or_the_episode(executor: PythonExecutorService) -> None:
    named = PythonTool(executor, name="named", render="result", session=None)
    assert "session_id" in named.schema_in["properties"] and not named.accepts_state
    assert not named.episode_sessions
    dispatcher = Dispatcher(ToolRegistry([named]))
    first = await dispatcher.acall(ToolCall("named", {"code": "x = 5", "session_id": "s"}))
    again = await dispatcher.acall(ToolCall("named", {"code": "print(x)", "session_id": "s"}))
    assert first.ok and again.value["stdout"] == "5\n"
    await executor.aclose_session("s")
    # the default reads the episode's session from _state, so episodes own the executor
    episodic = python_tool(executor)
    assert episodic.accepts_state and episodic.episode_sessions
    assert "session_id" not in episodic.schema_in["properties"]
    async with Episode([episodic]) as episode:
        assert episode.python is executor
    # a tool keyed by another _state entry (TorchRL's batch_index) does not
    assert Episode([PythonTool(executor, session="batch_index")], parser=None).python is None


def test_an_unknown_render_is_refused(executor: PythonExecutorService) -> None:
    with pytest.raises(UserError, match="'text', 'stdout', 'result'"):
        python_tool(executor, render="html")  # type: ignore[arg-type]


def test_the_transform_and_the_mcp_server_use_the_same_tool(
    executor: PythonExecutorService,
) -> None:
    from toolservices.mcp import python_tools

    served = python_tools(executor)[0]
    assert isinstance(served, PythonTool) and served.render == "result"
    assert served.name == "python_execute" and served.session is None
    pytest.importorskip("torch")
    from toolservices.torchrl import PythonInterpreter

    transform = PythonInterpreter(timeout=2.0, pool_size=1)
    try:
        (tool,) = list(transform.registry)
        assert isinstance(tool, PythonTool) and tool.render == "stdout"
        assert tool.session == "batch_index" and tool.timeout == 2.0 + 5.0
    finally:
        transform.close()
