"""Parse throughput per tool-call format.

For every family: a realistic response (a sentence of prose, then 1 or 4
calls with nested / unicode arguments, written by the family's own
``render``) is parsed repeatedly; we report the median over several repeats
of microseconds per response and calls per second. TorchRL 0.14.1's
``XMLBlockParser`` and ``JSONCallParser`` run side by side (interleaved) on the
same inputs for ``xml_block`` and ``json_envelope``. Times are CPU time of this
process, so other load on a shared machine does not inflate them.

Then large inputs (1 MB and 10 MB of characters) per family: valid calls (the
4-call response repeated), and two adversarial malformed shapes repeated: the
first half of a call (``prefix``) and a call missing its last three characters
(``unclosed``). Parsing is linear, so MB/s should stay flat from 1 to 10 MB.

Run: ``.venv/bin/python benchmarks/bench_parsing.py [--repeats 7] [--target 0.05]
[--large-mb 1,10 | --large-mb none]``
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

from toolservices.parsing import ToolCall, get_parser
from toolservices.parsing.registry import PARSERS

PROSE = (
    "Let me look that up. I'll check the forecast for the cities you asked about "
    "and search for events this weekend, then summarise everything."
)
SPECS = [
    {
        "name": "get_weather",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string"},
                "days": {"type": "integer"},
                "metric": {"type": "boolean"},
            },
        },
    },
    {
        "name": "search_events",
        "parameters": {
            "type": "object",
            "properties": {
                "query": {"type": "string"},
                "filters": {"type": "object"},
                "limit": {"type": "integer"},
            },
        },
    },
]
CALLS = [
    ToolCall("get_weather", {"city": "Paris", "days": 3, "metric": True}),
    ToolCall(
        "search_events",
        {"query": "concerts à Paris ce week-end", "filters": {"genre": ["jazz"]}, "limit": 5},
    ),
    ToolCall("get_weather", {"city": "東京", "days": 1, "metric": True}),
    ToolCall("search_events", {"query": "museum", "filters": {"free": True}, "limit": 10}),
]
CODE = "import math\nvalues = [math.sqrt(i) for i in range(10)]\nprint(sum(values))"


def _calls_for(family: str, count: int) -> list[ToolCall]:
    if family == "python_block":
        return [ToolCall("python", {"code": CODE}) for _ in range(count)]
    return CALLS[:count]


def _loops_for(fn: Callable[[], Any], target: float) -> int:
    """How many calls of ``fn`` take about ``target`` seconds of CPU time."""
    loops = 1
    while True:
        spent = _cpu_per_call(fn, loops) * loops
        if spent >= target / 4 or loops >= 1 << 20:
            return max(1, int(loops * target / max(spent, 1e-9)))
        loops *= 2


def _cpu_per_call(fn: Callable[[], Any], loops: int) -> float:
    # CPU time of this process, not wall time: the benchmark machine is shared,
    # and other processes' load must not count as parser time.
    start = time.process_time()
    for _ in range(loops):
        fn()
    return (time.process_time() - start) / loops


def _median_per_call(fn: Callable[[], Any], *, repeats: int, target: float) -> float:
    """Median CPU seconds per ``fn()`` over ``repeats`` runs of ~``target`` seconds."""
    loops = _loops_for(fn, target)
    return statistics.median(_cpu_per_call(fn, loops) for _ in range(repeats))


def _side_by_side(
    ours: Callable[[], Any], theirs: Callable[[], Any], *, repeats: int, target: float
) -> tuple[float, float, float]:
    """Interleaved runs of both; medians of each and of the per-run ratio."""
    loops_ours, loops_theirs = _loops_for(ours, target), _loops_for(theirs, target)
    mine, other, ratios = [], [], []
    for _ in range(repeats):
        a = _cpu_per_call(ours, loops_ours)
        b = _cpu_per_call(theirs, loops_theirs)
        mine.append(a)
        other.append(b)
        ratios.append(a / b)
    return statistics.median(mine), statistics.median(other), statistics.median(ratios)


def _large_inputs(sizes_mb: list[float], inputs: dict[str, dict[int, str]]) -> None:
    """CPU ms and MB/s per family on ``sizes_mb`` of valid and of malformed text."""
    print("\n# large inputs (CPU ms per response, MB/s in brackets; 1 MB = 10^6 characters)")
    shapes = ("valid", "prefix", "unclosed")
    header = " ".join(f"{f'{shape} {mb:g}MB':>20}" for shape in shapes for mb in sizes_mb)
    print(f"{'format':<16} {header}")
    for family in PARSERS:
        parser = get_parser(family, tools=SPECS)
        one = parser.render(_calls_for(family, 1), "")
        units = {
            "valid": inputs[family][4] + "\n",
            "prefix": one[: len(one) // 2],
            "unclosed": one[:-3],
        }
        row = [f"{family:<16}"]
        for shape in shapes:
            for mb in sizes_mb:
                size = int(mb * 1_000_000)
                unit = units[shape]
                text = (unit * (size // len(unit) + 1))[:size]
                runs = 3 if mb <= 1 else 1
                seconds = statistics.median(
                    _cpu_per_call(lambda t=text, p=parser: p(t), 1) for _ in range(runs)
                )
                row.append(f"{seconds * 1e3:>10.1f} ({size / 1e6 / max(seconds, 1e-9):>6.0f})")
        print(" ".join(row), flush=True)


def main(argv: list[str] | None = None) -> int:
    options = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    options.add_argument("--repeats", type=int, default=7)
    options.add_argument("--target", type=float, default=0.05, help="seconds per repeat")
    options.add_argument("--no-torchrl", action="store_true")
    options.add_argument(
        "--large-mb", default="1,10", help="sizes (MB) of the large-input table, or 'none'"
    )
    args = options.parse_args(argv)

    print(f"# parse throughput (median of {args.repeats} repeats; CPU µs per response)")
    print(f"{'format':<16} {'1 call µs':>10} {'calls/s':>10} {'4 calls µs':>11} {'calls/s':>10}")
    inputs: dict[str, dict[int, str]] = {}
    for family in PARSERS:
        parser = get_parser(family, tools=SPECS)
        row = [f"{family:<16}"]
        inputs[family] = {}
        for count in (1, 4):
            calls = _calls_for(family, count)
            response = parser.render(calls, PROSE)
            inputs[family][count] = response
            result = parser(response)
            assert len(result.calls) == count and not result.errors, (family, result.errors)
            seconds = _median_per_call(
                lambda p=parser, r=response: p(r), repeats=args.repeats, target=args.target
            )
            row.append(f"{seconds * 1e6:>10.1f} {count / seconds:>10,.0f}")
        print(" ".join(row))

    if args.large_mb != "none":
        _large_inputs([float(mb) for mb in args.large_mb.split(",")], inputs)
    if args.no_torchrl:
        return 0
    try:
        from torchrl.envs.llm.transforms.tools import JSONCallParser, XMLBlockParser
    except ImportError:
        print("\ntorchrl not installed: side-by-side comparison skipped")
        return 0
    print("\n# side by side with TorchRL 0.14.1 (same inputs, interleaved; CPU µs per response)")
    print(f"{'format':<16} {'calls':>5} {'toolservices':>13} {'torchrl':>9} {'ours/torchrl':>13}")
    pairs = {"xml_block": XMLBlockParser(), "json_envelope": JSONCallParser()}
    for family, theirs in pairs.items():
        ours = get_parser(family)
        for count in (1, 4):
            response = inputs[family][count]
            assert [c.tool for c in ours(response).calls] == [
                c.tool for c in theirs(response)["calls"]
            ]
            mine, other, ratio = _side_by_side(
                lambda r=response, f=ours: f(r),
                lambda r=response, f=theirs: f(r),
                repeats=args.repeats,
                target=args.target,
            )
            print(f"{family:<16} {count:>5} {mine * 1e6:>13.1f} {other * 1e6:>9.1f} {ratio:>13.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
