"""Run inside a judge session (standard library only): the cells of a ``run_jupyter``
request in one interpreter, as a notebook kernel would, results written as JSON.

Sent as source text (``_judge.py`` reads this file); not imported by the package.
"""

from __future__ import annotations

import ast
import contextlib
import io
import json
import signal
import sys
import traceback
from types import FrameType
from typing import Any


def _expired(signum: int, frame: FrameType | None) -> None:
    raise TimeoutError("the cell ran longer than cell_timeout")


def _cell(source: str, scope: dict[str, Any], timeout: float) -> dict[str, Any]:
    out, err = io.StringIO(), io.StringIO()
    display: list[dict[str, str]] = []
    error: list[dict[str, Any]] = []
    result: dict[str, Any] = {"stdout": "", "stderr": "", "display": display, "error": error}
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            if timeout > 0:
                signal.setitimer(signal.ITIMER_REAL, timeout)
            tree = ast.parse(source, "<cell>", "exec")
            last = tree.body[-1] if tree.body else None
            if isinstance(last, ast.Expr):
                tree.body.pop()
            else:
                last = None
            exec(compile(tree, "<cell>", "exec"), scope)
            if last is not None:
                value = eval(compile(ast.Expression(last.value), "<cell>", "eval"), scope)
                if value is not None:
                    display.append({"text/plain": repr(value)})
        except BaseException as exc:  # a notebook reports every error of a cell and goes on
            tb = exc.__traceback__.tb_next if exc.__traceback__ else None  # not this frame
            lines = traceback.format_exception(type(exc), exc, tb)
            error.append({"ename": type(exc).__name__, "evalue": str(exc), "traceback": lines})
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
    result["stdout"], result["stderr"] = out.getvalue(), err.getvalue()
    return result


def main() -> None:
    with open("_judge_cells.json", encoding="utf-8") as f:
        spec = json.load(f)
    signal.signal(signal.SIGALRM, _expired)
    scope = {"__name__": "__main__"}
    cells = [_cell(src, scope, spec["cell_timeout"]) for src in spec["cells"]]
    with open(spec["output"], "w", encoding="utf-8") as f:
        json.dump(cells, f)
    sys.stdout.flush()


main()
