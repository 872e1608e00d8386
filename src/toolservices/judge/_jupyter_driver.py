"""Run inside a judge session (standard library only): the cells of a ``run_jupyter``
request in one interpreter, as a notebook kernel would, results written as JSON."""

import ast
import contextlib
import io
import json
import signal
import sys
import traceback


def _expired(signum, frame):
    raise TimeoutError("the cell ran longer than cell_timeout")


def _cell(source, scope, timeout):
    out, err = io.StringIO(), io.StringIO()
    result = {"stdout": "", "stderr": "", "display": [], "error": []}
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            if timeout > 0:
                signal.setitimer(signal.ITIMER_REAL, timeout)
            tree = ast.parse(source, "<cell>", "exec")
            last = tree.body.pop() if tree.body and isinstance(tree.body[-1], ast.Expr) else None
            exec(compile(tree, "<cell>", "exec"), scope)
            if last is not None:
                value = eval(compile(ast.Expression(last.value), "<cell>", "eval"), scope)
                if value is not None:
                    result["display"].append({"text/plain": repr(value)})
        except BaseException as exc:  # a notebook reports every error of a cell and goes on
            tb = exc.__traceback__.tb_next if exc.__traceback__ else None  # not this frame
            lines = traceback.format_exception(type(exc), exc, tb)
            result["error"].append(
                {"ename": type(exc).__name__, "evalue": str(exc), "traceback": lines}
            )
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
    result["stdout"], result["stderr"] = out.getvalue(), err.getvalue()
    return result


def main():
    with open("_judge_cells.json", encoding="utf-8") as f:
        spec = json.load(f)
    signal.signal(signal.SIGALRM, _expired)
    scope = {"__name__": "__main__"}
    cells = [_cell(src, scope, spec["cell_timeout"]) for src in spec["cells"]]
    with open(spec["output"], "w", encoding="utf-8") as f:
        json.dump(cells, f)
    sys.stdout.flush()


main()
