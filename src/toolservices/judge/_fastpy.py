"""Python submissions without a shell: the program runs as ``__main__`` in a fresh
interpreter of the Python executor (forked from its fork server, in the same sandbox),
which saves the shell session's supervisor, spawner and ``exec`` of a new interpreter.

What the program sees is what ``python main.py`` gives it: ``__name__ == "__main__"``,
``sys.argv == ["main.py"]``, ``__file__``, its ``stdin`` on file descriptor 0 (a memfd),
the request's files in its working directory, ``RLIMIT_AS``/``DATA``/``STACK`` lowered to
the request's limit, tracebacks of its own frames only, exit statuses of ``sys.exit``,
``os._exit`` and signals, CPython's own ``sys.setrecursionlimit`` (the executor's clamp
is an interactive session's safety net). Used for ``python`` requests that fetch no files
back.
"""

from __future__ import annotations

from collections.abc import Mapping

__all__ = ["wrap"]

# Only modules the fork server has loaded already (a fresh interpreter pays for every
# other import: base64 alone was 1.5 ms of a request's ~10): the program and its stdin
# travel as string literals (exact, lone surrogates included), the files as hex.
_WRAPPER = """\
import os as _os, resource as _r, sys as _s, traceback as _t
for _name, _data in {files!r}.items():
    _dir = _os.path.dirname(_name)
    if _dir:
        _os.makedirs(_dir, exist_ok=True)
    with open(_name, "wb") as _f:
        _f.write(bytes.fromhex(_data))
_src = {code!r}
with open("main.py", "w", encoding="utf-8", errors="surrogateescape") as _f:
    _f.write(_src)
_fd = _os.memfd_create("stdin")
_os.write(_fd, {stdin!r}.encode())
_os.lseek(_fd, 0, 0)
_os.dup2(_fd, 0)
_os.close(_fd)
_s.stdin = _s.__stdin__ = open(0, "r", closefd=False)
# as a script's: stdout block-buffered into its pipe, stderr line-buffered
_s.stdout = _s.__stdout__ = open(1, "w", encoding="utf-8", closefd=False)
_s.stderr = _s.__stderr__ = open(
    2, "w", encoding="utf-8", errors="backslashreplace", buffering=1, closefd=False
)
_s.argv = ["main.py"]
# the executor clamps sys.setrecursionlimit (an interactive session's safety); a script
# gets CPython's own, as `python main.py` does: deep recursion is the stack's business
for _cell in getattr(_s.setrecursionlimit, "__closure__", None) or ():
    if getattr(_cell.cell_contents, "__self__", None) is _s:
        _s.setrecursionlimit = _cell.cell_contents
for _res in (_r.RLIMIT_AS, _r.RLIMIT_DATA, _r.RLIMIT_STACK):
    _r.setrlimit(_res, ({limit}, {limit}) if _res != _r.RLIMIT_STACK else ({stack}, {stack}))
_main = {{"__name__": "__main__", "__file__": "main.py", "__builtins__": __builtins__}}
try:
    exec(compile(_src, "main.py", "exec"), _main)
except SystemExit:
    raise
except BaseException as _e:
    _s.stdout.flush()
    _t.print_exception(type(_e), _e, _e.__traceback__.tb_next)
    raise SystemExit(1) from None
finally:
    for _stream in (_s.stdout, _s.stderr):
        try:
            _stream.flush()
        except (OSError, ValueError):
            pass
"""


def wrap(
    code: str, stdin: str | None, files: Mapping[str, bytes], limit_bytes: int, stack: int
) -> str:
    """The snippet that runs ``code`` as a script in a fresh interpreter."""
    return _WRAPPER.format(
        files={name: data.hex() for name, data in files.items()},
        code=code,
        stdin=stdin or "",
        limit=limit_bytes,
        stack=stack,
    )
