"""One normalisation of ``parser=`` (parsing.as_parser), and the names of the parse records."""

from __future__ import annotations

from typing import Any

import pytest

import toolservices
from toolservices import Episode, ToolEnv, ToolRegistry, UserError, tool
from toolservices.errors import ToolBusyError
from toolservices.parsing import (
    HermesParser,
    ParseError,
    ParseFailure,
    ParseResult,
    ServerCallsParser,
    ToolCall,
    as_parser,
)
from toolservices.rollout import Rollout


@tool
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


REGISTRY = ToolRegistry([add])


def torchrl_style(text: str) -> dict[str, Any]:
    """A parser as TorchRL users write them: a mapping of text and call objects."""
    return {"text": "visible", "calls": [{"tool": "add", "args": {"a": 1, "b": 2}, "tag": "t"}]}


def test_names_objects_and_none() -> None:
    hermes = as_parser("hermes", tools=REGISTRY)
    assert isinstance(hermes, HermesParser)
    assert as_parser(hermes) is hermes
    server = as_parser(None)
    assert isinstance(server, ServerCallsParser) and server.name == "server"
    assert server("<tool_call>{}</tool_call>").calls == []
    with pytest.raises(UserError, match="Unknown tool-call parser"):
        as_parser("no such family")
    with pytest.raises(UserError, match="parser must be"):
        as_parser(42)  # type: ignore[arg-type]


def test_a_callable_returning_a_mapping_becomes_a_parse_result() -> None:
    parser = as_parser(torchrl_style)
    result = parser("anything")
    assert isinstance(result, ParseResult) and result.text == "visible"
    (call,) = result.calls
    assert (call.tool, call.args, call.tag) == ("add", {"a": 1, "b": 2}, "t")
    assert call.id.startswith("call_")
    assert as_parser(parser) is parser  # normalising twice changes nothing


def test_arguments_that_are_not_an_object_are_a_parse_failure_not_raw() -> None:
    """No ``{"raw": args}`` outside the TorchRL contract's XMLBlockParser."""

    def odd(text: str) -> dict[str, Any]:
        return {
            "text": "",
            "calls": [
                {"tool": "add", "args": '{"a": 1, "b": 2}'},  # JSON text: decoded
                {"tool": "add", "args": "not json"},
                {"tool": "add", "args": [1, 2]},
            ],
        }

    result = as_parser(odd)("x")
    assert [c.args for c in result.calls] == [{"a": 1, "b": 2}]
    assert [(e.tool, e.kind) for e in result.errors] == [("add", "invalid_json")] * 2
    assert "must be a JSON object" in result.errors[0].message


def test_a_callable_that_raises_gives_a_parse_failure_the_model_reads() -> None:
    def broken(text: str) -> ParseResult:
        raise ValueError("bad input")

    result = as_parser(broken)("the text")
    assert result.calls == [] and result.text == "the text"
    assert "could not be parsed: bad input" in result.errors[0].message


def test_every_layer_accepts_the_same_parser_forms() -> None:
    for layer in (
        lambda p: Episode(REGISTRY, parser=p).parser,
        lambda p: ToolEnv(REGISTRY, parser=p).parser,
        lambda p: Rollout(REGISTRY, model="m", base_url="http://127.0.0.1:9", parser=p).parser,
    ):
        assert isinstance(layer(None), ServerCallsParser)
        assert isinstance(layer("hermes"), HermesParser)
        assert layer(torchrl_style)("x").calls[0].args == {"a": 1, "b": 2}


async def test_an_episode_runs_a_callable_parsers_calls() -> None:
    episode = Episode(REGISTRY, parser=torchrl_style)
    (message,) = await episode.astep("x")
    assert message["content"] == "3"


def test_parse_failure_is_a_record_with_its_old_name_kept() -> None:
    assert ParseError is ParseFailure
    assert toolservices.ParseFailure is ParseFailure and toolservices.ParseError is ParseFailure
    assert not issubclass(ParseFailure, BaseException)
    assert ParseResult(errors=[ParseFailure("m")]).errors[0].message == "m"
    assert ToolCall("a", {}).tool == "a"


def test_tool_busy_error_is_exported() -> None:
    assert toolservices.ToolBusyError is ToolBusyError
    assert "ToolBusyError" in toolservices.__all__
    assert toolservices.as_parser is as_parser
