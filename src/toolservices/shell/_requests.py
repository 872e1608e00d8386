"""Requests to a shell session's supervisor, and what its replies say.

A request is Python source the executor runs in the session: one call of the
supervisor's entry point (a builtin name since the executor's fork server
loaded the modules once for every session, ``preload_code``) with one JSON
text, or, in a session that lacks it, the supervisor's own code first (the
bootstrap). What the call returns the session runs after the reply
(``AFTER_REPLY``: the state a command saves after it answered). The reply is
the last line of the session's stdout, a JSON object carrying the service's
token (a line the session printed itself cannot). Sessions whose state was lost in a call that
could not say so are remembered until a command reports it.
"""

from __future__ import annotations

import base64
import json
import marshal
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any

from toolservices._clip import omitted_marker
from toolservices.errors import InfrastructureError
from toolservices.python import ExecResult, PythonExecutorService
from toolservices.python.runtime import AFTER_REPLY
from toolservices.shell._checks import RUN_FIELDS, checked, died
from toolservices.shell._native import library as native_library
from toolservices.shell._result import ShellFileError, ShellResult

if TYPE_CHECKING:
    from toolservices.shell._images import SessionImages

__all__ = ["SupervisorRequests", "preload_code", "warmup_code"]

#: the name the supervisor's entry point has in a session's globals
_ENTRY = "__ts_shell__"
_HERE = Path(__file__).parent
# Compiled here once and sent marshalled: sessions run this very interpreter (the fork
# server is started with sys.executable), and unmarshalling costs far less than compiling.
# Base64 text: a bytes literal full of escapes takes the session 4x longer to tokenize.
_CODE = {
    name: base64.b64encode(
        marshal.dumps(
            compile((_HERE / f"{file}.py").read_text("utf-8"), f"<{name}>", "exec", optimize=2)
        )
    ).decode()
    for name, file in (  # each after the modules it uses (the supervisor's split: shell.md)
        ("_toolservices_shell_procs", "_procs"),
        ("_toolservices_shell_files", "_files"),
        ("_toolservices_shell_spawner", "_spawner"),
        ("_toolservices_shell_terminal", "_terminal"),
        ("_toolservices_shell_command", "_command"),
        ("_toolservices_shell_native", "_native"),
        ("_toolservices_shell_python", "_pyworker"),
        ("_toolservices_shell", "_supervisor"),
    )
}


def _builtin_line() -> str:
    """The line of the preload that hands the bash builtin's bytes to ``_native`` (sessions on
    an image load it from a memfd); none where the package has no builtin."""
    library = native_library()
    if library is None:
        return ""
    with open(library, "rb") as fh:
        blob = base64.b64encode(fh.read()).decode()
    return f"_s.modules['_toolservices_shell_native'].BUILTIN = _b.a2b_base64({blob!r})\n"


#: the supervisor's top module, loaded last: once it is in ``sys.modules`` all of them are
_TOP = "_toolservices_shell"
# Run once by the fork server (``preload_code``): every session then shares these modules'
# pages copy-on-write instead of loading a private copy of them (docs/shell.md).
_LOAD = (
    "import binascii as _b, marshal as _ma, sys as _s, types as _t\n"
    f"for _n, _c in {_CODE!r}.items():\n"
    "    _m = _t.ModuleType(_n)\n"
    "    _s.modules[_n] = _m\n"
    "    exec(_ma.loads(_b.a2b_base64(_c)), _m.__dict__)\n"
    + _builtin_line()
    + "del _b, _ma, _s, _t, _m, _n, _c\n"
)
# The fork server also makes the entry point a builtin name: every session's request is then
# one line to compile (17 us, against 77 for the binding and its test each time).
_LOAD += f"__import__('builtins').{_ENTRY} = __import__('sys').modules[{_TOP!r}].request\n"
# A session binds the entry point from the preloaded modules (a spare's warm-up).
_BIND = (
    f"if {_ENTRY!r} not in globals() and {_TOP!r} in __import__('sys').modules:\n"
    f"    {_ENTRY} = __import__('sys').modules[{_TOP!r}].request\n"
)
# The same where the modules may be missing (an interpreter that did not come from the
# fork server's preloaded state): loads them. Idempotent: a live session keeps its state.
_BOOTSTRAP = (
    _BIND
    + f"if {_ENTRY!r} not in globals():\n"
    + "".join(f"    {line}\n" for line in _LOAD.splitlines())
    + f"    {_ENTRY} = __import__('sys').modules[{_TOP!r}].request\n"
)


def preload_code() -> str:
    """What the executor's fork server runs once: the supervisor's modules, shared by all."""
    return _LOAD


def _call(op: str, args: dict[str, Any], config_json: str) -> str:
    """A call of the entry point with one JSON text (op, args, the session's config)."""
    text = f'{{"op": {json.dumps(op)}, "args": {json.dumps(args)}, "config": {config_json}}}'
    return f"{_ENTRY}({text!r})"


def warmup_code(config_json: str) -> str:
    """What a spare interpreter runs ahead of need: bind the supervisor, start the first bash
    (a spare without it is left cold: its first request loads it)."""
    return f"{_BIND}if {_ENTRY!r} in globals():\n    {_call('warm', {}, config_json)}\n"


def _text(data: bytes, total: int, cap: int) -> tuple[str, bool]:
    """A stream as the supervisor kept it: whole, or its head and tail around a marker."""
    if total <= cap:
        return data.decode("utf-8", "replace"), False
    head = cap - cap // 2
    return (
        data[:head].decode("utf-8", "replace")
        + omitted_marker(total - len(data))
        + data[head:].decode("utf-8", "replace")
    ), True


class SupervisorRequests:
    """The requests and replies of a ``ShellService`` (its base class: the service sets
    ``_python``, ``_images``, ``max_sessions`` and ``max_output`` and calls
    :meth:`_init_requests`)."""

    _python: PythonExecutorService
    _images: SessionImages
    max_sessions: int
    max_output: int

    def _init_requests(self, config: dict[str, Any]) -> None:
        self._config = config
        self._config_json = json.dumps(config)  # in every request's source: written once
        self._lock = threading.Lock()
        # sessions whose state or files were lost in a call that could not say so (a file
        # tool's, or a command whose supervisor died): their next command reports it
        self._lost: dict[str, None] = {}
        # sessions whose Python interpreter ran, and whether its state was lost since (the
        # session evicted or restarted under another tool): news for their next Python call
        self._pythons: dict[str, bool] = {}
        self._counters = dict.fromkeys(
            (
                "commands",
                "timeouts",
                "restarts",
                "failures",
                "files",
                "python_calls",
                "python_timeouts",
                "python_restarts",
                "python_failures",
            ),
            0,
        )

    def _code(self, op: str, args: dict[str, Any], boot: bool, session_id: str | None) -> str:
        # a session on another image than the service's has its own (its WorkingDir)
        config = self._images.config_json(session_id) or self._config_json
        # the supervisor's answer is what the session runs after the reply (its state saved)
        call = f"{AFTER_REPLY} = {_call(op, args, config)}\n"
        # a session without the entry point (not from the preloaded fork server) raises a
        # NameError: then the bootstrap loads the supervisor
        return f"{_BOOTSTRAP}{call}" if boot else call

    @staticmethod
    def _needs_boot(res: ExecResult) -> bool:
        exc = res.exception
        return exc is not None and exc.type == "NameError" and _ENTRY in exc.message

    async def _execute(
        self, code: str, session_id: str | None, limit: float, inline: bool
    ) -> ExecResult:
        """The executor's call: its sync face when ``inline`` (run by :func:`run_inline` in the
        caller's thread, where a call on an idle session skips the loop), else its async one."""
        if inline:
            return self._python.execute(code, session_id=session_id, timeout=limit)
        return await self._python.aexecute(code, session_id=session_id, timeout=limit)

    async def _request(
        self, op: str, args: dict[str, Any], session_id: str | None, limit: float, inline: bool
    ) -> tuple[ExecResult, bool]:
        # every session comes from the fork server, which preloaded the supervisor (see
        # ``preload_code``): the request binds it; one that lacks it answers cold, and loads it
        code = self._code(op, args, False, session_id)
        res = await self._execute(code, session_id, limit, inline)
        lost = res.restarted
        if self._needs_boot(res):
            code = self._code(op, args, True, session_id)
            res = await self._execute(code, session_id, limit, inline)
            lost = lost or res.restarted
        return res, self._note_lost(session_id, res, lost)

    def _note_lost(self, session_id: str | None, res: ExecResult, lost: bool) -> bool:
        """``lost`` (the state was gone before this call); remembered, with a loss in this
        call (a timeout or a crash kills the session), until a command reports it."""
        gone = res.timed_out or died(res)
        if session_id is not None and (lost or gone):
            with self._lock:
                self._lost[session_id] = None
                while len(self._lost) > 4 * self.max_sessions:  # the oldest news goes first
                    del self._lost[next(iter(self._lost))]
                if session_id in self._pythons:  # its interpreter went with the session
                    self._pythons[session_id] = True
        return lost

    def _python_lost(self, session_id: str | None, started: bool) -> bool:
        """Pop the news that ``session_id``'s Python state was lost since its last Python
        call (whichever tool's call lost it); ``started``: this call ran an interpreter there,
        whose state a later loss takes (False: the session has none, or was closed)."""
        if session_id is None:
            return False
        with self._lock:
            lost = self._pythons.pop(session_id, False)
            if started:
                self._pythons[session_id] = False
                while len(self._pythons) > 4 * self.max_sessions:  # forgetting: a missed note
                    del self._pythons[next(iter(self._pythons))]
        return lost

    def _reported_lost(self, session_id: str | None) -> bool:
        """Pop the news that ``session_id`` lost its state (a command is reporting it)."""
        if session_id is None:
            return False
        with self._lock:
            return self._lost.pop(session_id, 0) is None

    def _reply(self, res: ExecResult, fields: dict[str, Any] | None = None) -> dict[str, Any]:
        """The supervisor's reply: its last line, with our token and ``fields`` of their types.

        Anything else (a line the session forged, a crafted or truncated
        reply) is an :class:`InfrastructureError`, never a ``KeyError``.
        """
        if res.exception is None and res.success:
            lines = res.stdout.strip().splitlines()
            try:
                reply = json.loads(lines[-1]) if lines else None
            except ValueError:
                reply = None
            if isinstance(reply, dict):
                if reply.get("token") != self._config["token"]:
                    raise InfrastructureError(
                        "the shell session's reply did not come from its supervisor", retryable=True
                    )
                return checked(reply, fields or {})
        detail = res.exception.message if res.exception else f"status {res.returncode}"
        raise InfrastructureError(
            f"the shell session's supervisor failed ({detail}): {res.stderr[-400:]}", retryable=True
        )

    def _bump(self, **counts: int) -> None:
        with self._lock:
            for key, n in counts.items():
                self._counters[key] += n

    def _result(self, res: ExecResult, lost: bool, session_id: str | None) -> ShellResult:
        lost = self._reported_lost(session_id) or lost  # also what an earlier call lost
        if res.timed_out or died(res):  # the supervisor did not answer: its session is gone
            what = (
                "did not answer in time"
                if res.timed_out
                else f"ended while the command ran ({res.exception.message})"
                if res.exception
                else "ended"
            )
            had_state = session_id is not None  # a fresh shell has none to lose
            self._bump(commands=1, timeouts=int(res.timed_out), restarts=int(had_state), failures=1)
            return ShellResult(
                success=False,
                stdout="",
                stderr=f"[the shell session {what}; it was restarted: files, variables and "
                "the working directory are lost]\n",
                returncode=-1 if res.timed_out or res.returncode >= 0 else res.returncode,
                duration=res.duration,
                timed_out=res.timed_out,
                restarted=had_state,
                session_id=session_id,
            )
        reply = self._reply(res, RUN_FIELDS)
        cap = self.max_output
        out, cut_out = _text(base64.b64decode(reply["stdout"]), reply["stdout_total"], cap)
        err, cut_err = _text(base64.b64decode(reply["stderr"]), reply["stderr_total"], cap)
        if reply["timed_out"]:
            err += (
                f"\n[timed out after {reply['limit']:g} s: the command and every process it "
                "started were killed]\n"
            )
        if reply.get("no_terminal"):
            err += (
                f"\n[{reply['no_terminal']} was waiting for keys from a terminal, and commands "
                "have none: it and every process the command started were killed. Edit files "
                "with write_file, str_replace or sed; run programs non-interactively]\n"
            )
        restarted = bool(reply["restarted"]) or lost
        if session_id is None:
            restarted = False  # a fresh shell has no state to lose
        ok = reply["returncode"] == 0 and not reply["timed_out"]
        self._bump(
            commands=1,
            timeouts=int(reply["timed_out"]),
            restarts=int(restarted),
            failures=int(not ok),
        )
        return ShellResult(
            success=ok,
            stdout=out,
            stderr=err,
            returncode=int(reply["returncode"]),
            duration=float(reply["duration"]),
            timed_out=bool(reply["timed_out"]),
            truncated=cut_out or cut_err,
            restarted=restarted,
            session_id=session_id,
        )

    def _file_reply(self, op: str, path: str, res: ExecResult, **fields: Any) -> dict[str, Any]:
        self._bump(files=1)
        if res.timed_out:
            raise ShellFileError(op, path, "ETIMEDOUT", "the operation timed out")
        reply = self._reply(res)
        if not reply.get("ok"):
            raise ShellFileError(op, path, str(reply.get("errno")), str(reply.get("message")))
        return checked(reply, fields)
