"""Inputs no parser may raise on or slow down for: bad Unicode, wrong types, size.

Every check runs over every registered name (``available_parsers()``), so
families added later get the same guarantees from the shared entry point.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest

from toolservices.errors import UserError
from toolservices.parsing import ToolCall, ToolParser, available_parsers, get_parser
from toolservices.parsing.base import DEFAULT_MAX_CHARS
from toolservices.parsing.registry import PARSERS


def _call_for(name: str) -> ToolCall:
    if get_parser(name).name == "python_block":
        return ToolCall("python", {"code": "print('x')"})
    return ToolCall("get_weather", {"city": "Paris", "days": "3"})


def _response(parser: ToolParser, call: ToolCall) -> str:
    return parser.render([call], "Checking the weather.")


# --- 1. lone surrogates -----------------------------------------------------------


@pytest.mark.parametrize("name", available_parsers())
def test_lone_surrogate_is_a_parse_error_not_an_exception(name: str) -> None:
    parser = get_parser(name)
    call = _call_for(name)
    good = _response(parser, call)
    assert parser(good).calls, "the well-formed response must parse"
    inside_args = ToolCall(call.tool, {k: f"{v}\ud800" for k, v in call.args.items()})
    for response in (
        good + "\ud800",
        "\udfff" + good,
        _response(parser, inside_args),
        good.replace(call.tool, call.tool[:3] + "\udc80" + call.tool[3:], 1),
    ):
        result = parser(response)
        assert result.calls == []
        [error] = result.errors
        assert error.kind == "invalid_text"
        assert "not valid Unicode" in error.message
        result.text.encode()  # the visible text is valid Unicode again
        error.raw.encode()
        error.message.encode()


@pytest.mark.parametrize("name", sorted(PARSERS))
def test_surrogate_pairs_are_joined_not_rejected(name: str) -> None:
    parser = get_parser(name)
    call = _call_for(name)
    key = next(iter(call.args))
    emoji = ToolCall(call.tool, {**call.args, key: "sun \U0001f600"})
    # The same character written as two UTF-16 halves (a lossy decoder's output).
    split = _response(parser, emoji).replace("\U0001f600", "\ud83d\ude00")
    result = parser(split)
    assert result.errors == []
    assert [(c.tool, c.args) for c in result.calls] == [(emoji.tool, emoji.args)]


def test_surrogate_from_a_json_escape_is_a_parse_error() -> None:
    response = (
        '<tool_call>{"name": "a", "arguments": {"s": "\\ud800"}}</tool_call>'
        '<tool_call>{"name": "b", "arguments": {"s": "\\ud83d\\ude00"}}</tool_call>'
    )
    result = get_parser("hermes")(response)
    assert [(c.tool, c.args) for c in result.calls] == [("b", {"s": "\U0001f600"})]
    [error] = result.errors
    assert error.kind == "invalid_text" and error.tool == "a"
    error.message.encode()


def test_surrogates_in_structured_tool_calls_are_parse_errors() -> None:
    message = {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {"id": "1", "function": {"name": "f", "arguments": {"s": "\ud800"}}},
            {"id": "2", "function": {"name": "g", "arguments": "{}"}},
        ],
    }
    result = get_parser("hermes")(message)
    assert [c.tool for c in result.calls] == ["g"]
    assert [e.kind for e in result.errors] == ["invalid_text"]


# --- 2. input types ---------------------------------------------------------------


@pytest.mark.parametrize("name", available_parsers())
@pytest.mark.parametrize("bad", [b"<tool_call>", bytearray(b"x"), 1, 2.5, ["text"], ("a",)])
def test_wrong_input_type_is_a_user_error_naming_the_accepted_types(name: str, bad: Any) -> None:
    parser = get_parser(name)
    with pytest.raises(UserError, match=r"parses a str, a chat message dict .* or None, got "):
        parser(bad)


@pytest.mark.parametrize("name", available_parsers())
def test_accepted_input_types(name: str) -> None:
    parser = get_parser(name)
    response = _response(parser, _call_for(name))
    assert parser(None).calls == [] and parser(None).errors == []
    assert len(parser(response).calls) == 1
    if parser.name != "json_envelope":  # its dict form is the envelope itself
        assert len(parser({"role": "assistant", "content": response}).calls) == 1
        assert len(parser({"text": response}).calls) == 1


def test_bytes_error_says_to_decode() -> None:
    with pytest.raises(UserError, match="decode bytes to str first"):
        get_parser("hermes")(b"hi")  # type: ignore[arg-type]


# --- 3. size limit ----------------------------------------------------------------


@pytest.mark.parametrize("name", available_parsers())
def test_responses_over_max_chars_get_one_too_long_error(name: str) -> None:
    response = _response(get_parser(name), _call_for(name))
    parser = get_parser(name, max_chars=len(response) - 1)
    result = parser(response)
    assert result.calls == []
    [error] = result.errors
    assert error.kind == "too_long"
    assert f"over the limit of {len(response) - 1:,}" in error.message
    assert result.text == response.strip()  # nothing is lost
    assert len(get_parser(name, max_chars=len(response))(response).calls) == 1


def test_max_chars_settings() -> None:
    assert get_parser("hermes").max_chars == DEFAULT_MAX_CHARS
    assert get_parser("hermes", max_chars=None).max_chars is None
    assert get_parser("mistral", max_chars=10).max_chars == 10
    for bad in (0, -1, 1.5, True, "10"):
        with pytest.raises(UserError, match="max_chars must be a positive int or None"):
            get_parser("hermes", max_chars=bad)  # type: ignore[arg-type]
    for cls in PARSERS.values():
        if cls.name != "regex":
            parser = cls(max_chars=5)
            assert parser.max_chars == 5
            assert parser("x" * 6).errors[0].kind == "too_long"


# --- 3. linear time ---------------------------------------------------------------


def _units(name: str) -> dict[str, str]:
    """One repeatable unit per shape: valid calls, many calls in one block, and cut-off
    prefixes / suffixes of a call (the adversarial inputs that used to be quadratic)."""
    parser = get_parser(name)
    call = _call_for(name)
    one = parser.render([call], "")
    units = {"valid": one + "\n", "prose": "Some prose here. " + one + "\n"}
    if parser.name != "python_block":
        units["many_in_one_block"] = parser.render([call] * 40, "") + "\n"
    for fraction in (0.1, 0.25, 0.5, 0.75, 0.9):
        units[f"prefix_{fraction}"] = one[: max(1, int(len(one) * fraction))]
    units["suffix"] = one[len(one) // 2 :]
    units["middle"] = one[len(one) // 4 : 3 * len(one) // 4]
    return units


def _cpu(fn: Callable[[], Any]) -> float:
    start = time.process_time()
    fn()
    return time.process_time() - start


def _growth(parser: ToolParser, unit: str, size: int) -> float:
    """CPU time on ``4 * size`` characters over time on ``size`` (best of 3 each)."""
    small = unit * (size // len(unit) + 1)
    large = unit * (4 * size // len(unit) + 1)
    t_small = min(_cpu(lambda: parser(small)) for _ in range(3))
    t_large = min(_cpu(lambda: parser(large)) for _ in range(3))
    return t_large / max(t_small, 1e-4)


@pytest.mark.timeout(240)
@pytest.mark.parametrize("name", sorted(PARSERS))
def test_parsing_time_grows_linearly(name: str) -> None:
    """4x the input must cost well under 16x (quadratic) the time: the bound is 10x.

    Sizes are large enough (100k -> 400k characters) that quadratic behaviour
    shows clearly; a ratio over the bound is re-measured once at twice the size
    before failing, so a burst of load on a shared machine does not decide.
    """
    parser = get_parser(name, max_chars=None)
    slow = {}
    for shape, unit in _units(name).items():
        ratio = _growth(parser, unit, 100_000)
        if ratio >= 10:
            ratio = _growth(parser, unit, 200_000)
        if ratio >= 10:
            slow[shape] = round(ratio, 1)
    assert not slow, f"{name}: super-linear growth (time ratio for 4x input) {slow}"
