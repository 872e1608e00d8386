"""The demo's shell scenario: one episode writes a program and its test, runs the
test (it fails), fixes the program with ``str_replace`` and runs the test again.

The turns are written as a Hermes-format model emits them and parsed by the
library; the tools run in the episode's own sandboxed shell session.
"""

from __future__ import annotations

import json
import time
from typing import Any, TextIO

from toolservices.env import Episode, python_tool, shell_tools

__all__ = ["hermes_calls", "play", "run_shell_demo"]

PROGRAM = "def add(a, b):\n    return a - b\n"
TEST = "from calc import add\n\nassert add(2, 3) == 5, add(2, 3)\nprint('tests passed')\n"


def hermes_calls(*calls: tuple[str, dict[str, Any]]) -> str:
    return "\n".join(
        f"<tool_call>\n{json.dumps({'name': name, 'arguments': args})}\n</tool_call>"
        for name, args in calls
    )


#: The model's turns; the last one answers.
TURNS = [
    "I'll write the function and a test for it.\n"
    + hermes_calls(
        ("write_file", {"path": "calc.py", "content": PROGRAM}),
        ("write_file", {"path": "test_calc.py", "content": TEST}),
    ),
    hermes_calls(("bash", {"command": "python3 test_calc.py"})),
    "The test fails: add subtracts. Fixing it.\n"
    + hermes_calls(("str_replace", {"path": "calc.py", "old_str": "a - b", "new_str": "a + b"})),
    hermes_calls(("bash", {"command": "python3 test_calc.py"})),
    "add() now adds, and its test passes.",
]
#: What the tool results of turns 2 and 4 must show: the failing run, then the passing one.
EXPECT = {1: "[exit status 1]", 3: "tests passed"}


async def run_shell_demo(out: TextIO) -> bool:
    """Play the scenario, print each call and the head of its result; whether it went as
    scripted. A machine without the sandbox gets a note instead (and counts as fine)."""
    from toolservices.errors import SandboxUnavailableError
    from toolservices.shell import ShellService

    print("\nshell scenario (one episode, its own sandboxed shell session):", file=out)
    started = time.perf_counter()
    try:
        shell = ShellService(pool_size=1, timeout=10.0)
    except SandboxUnavailableError as exc:
        print(f"  skipped: the sandbox is unavailable here ({exc})", file=out)
        return True
    try:
        problems, summary = await play(shell, TURNS, EXPECT, out)
    finally:
        await shell.aclose()
    wall = time.perf_counter() - started
    status = "ok" if not problems else "FAILED: " + "; ".join(problems)
    print(f"shell episode: {status} ({summary}, {wall:.2f} s with the service's start)", file=out)
    return not problems


async def play(
    shell: Any, turns: list[str], expect: dict[int, str], out: TextIO, *, python: bool = False
) -> tuple[list[str], str]:
    """One Hermes-format episode of ``turns`` on ``shell``'s tools, each call printed with
    the head of its result; what went otherwise than scripted (``expect``: a turn's index
    and what one of its results must hold) and a summary of the episode. ``python``: a
    ``python`` tool too, running in the same shell session (one environment)."""
    problems: list[str] = []
    tools = [*shell_tools(shell), *([python_tool(shell=shell)] if python else [])]
    async with Episode(tools, parser="hermes", max_turns=len(turns)) as ep:
        for turn, text in enumerate(turns):
            replies = await ep.astep(text)
            calls = ep.messages[-len(replies) - 1].get("tool_calls", []) if replies else []
            for number, (call, reply) in enumerate(zip(calls, replies, strict=True)):
                function = call["function"]
                args = json.loads(function["arguments"])
                target = args.get("command") or args.get("path", "")
                label = f"turn {turn + 1}" if number == 0 else ""
                head = _head(function["name"], str(reply["content"]))
                what = f"{function['name']} {target}"
                print(f"  {label:<7} {what:<28} -> {head}", file=out)
            want = expect.get(turn)
            if want and not any(want in str(r["content"]) for r in replies):
                problems.append(f"turn {turn + 1} lacks {want!r}")
        metrics, reason = ep.metrics, ep.reason
    if reason != "answered":
        problems.append(f"ended with {reason!r} instead of an answer")
    if metrics.failed_calls:
        problems.append(f"{metrics.failed_calls} call(s) failed")
    return problems, f"{reason} after {metrics.turns} turns, {metrics.calls} calls"


def _head(tool: str, text: str, width: int = 60) -> str:
    """One line of a result: a command's last output line (where a test run says how it
    went) and its exit status; the first line of the others."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if tool != "bash":
        line = lines[0] if lines else ""
    else:
        notes = [x for x in lines if x.startswith("[exit status")]
        output = [x for x in lines if not x.startswith("[")]
        line = " ".join((output[-1:] or [""]) + notes).strip()
    return line if len(line) <= width else line[: width - 3] + "..."
