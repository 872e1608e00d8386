"""``ShellService``: persistent shell sessions on the Python executor's sandboxed sessions."""

from __future__ import annotations

import base64
import dataclasses
import glob
import json
import marshal
import math
import os
import secrets
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, BinaryIO

from toolservices._clip import omitted_marker
from toolservices._portal import run_sync
from toolservices.errors import InfrastructureError, UserError
from toolservices.images import Image, ImageStore
from toolservices.python import ExecResult, PythonExecutorService
from toolservices.python.host import default_max_sessions
from toolservices.python.sandbox import (
    SandboxConfig,
    check_config,
    default_config,
    image_config,
    with_network,
)
from toolservices.shell._checks import (
    RUN_FIELDS,
    check_path,
    checked,
    died,
    encode,
    entry,
    largest_variable,
    lone_surrogate,
)
from toolservices.shell._native import library as native_library
from toolservices.shell._result import FileEntry, ShellFileError, ShellResult

__all__ = ["ShellService"]

#: seconds the supervisor gets beyond a command's own limit to kill its tree and report
_GRACE = 5.0
#: memory reserved per idle shell session for the default ``max_sessions``: 5.9-6.4 MiB
#: PSS measured (the supervisor, its spawner, a waiting bash; docs/benchmarks.md), rounded
#: up. Files in a workspace take memory too (a tmpfs), up to its ``disk_quota``.
SESSION_BYTES = 8 << 20
#: descriptors a shell session holds in the caller: the Python session's, plus its user
#: and mount namespaces (what fork_session copies its workspace through)
SESSION_FDS = 5
#: the default size cap of a session's workspace (each fork_session copy has its own)
DEFAULT_DISK_QUOTA = 1 << 30
#: the name the supervisor's entry point has in a session's globals
#: The soft stack limit of commands: a usual terminal's (glibc sizes thread stacks from it).
COMMAND_STACK = 8 * 1024 * 1024
#: Tasks (processes and threads) per shell session when no sandbox is given.
SHELL_NPROC = 256
#: /etc paths of toolchains the read-only root shows to shell sessions (when they exist).
_TOOLCHAIN_ETC = ("/etc/java-*",)
_ENTRY = "__ts_shell__"
#: what a call without the bootstrap prints in a session that has no supervisor yet
_COLD = '{"cold": true}'
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
        ("_toolservices_shell", "_supervisor"),
    )
}
# Idempotent: loading it again in a live session keeps its shell state.
_BOOTSTRAP = (
    f"if {_ENTRY!r} not in globals():\n"
    "    import binascii as _b, marshal as _ma, sys as _s, types as _t\n"
    f"    for _n, _c in {_CODE!r}.items():\n"
    "        _m = _t.ModuleType(_n)\n"
    "        _s.modules[_n] = _m\n"
    "        exec(_ma.loads(_b.a2b_base64(_c)), _m.__dict__)\n"
    f"    {_ENTRY} = _m.call\n"
    "    del _b, _ma, _s, _t, _m, _n, _c\n"
)


def _landlock_abi() -> int:
    from toolservices.python.runtime import landlock_abi

    return landlock_abi()


def _check_timeout(value: object, name: str = "timeout") -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise UserError(f"{name} must be a number of seconds > 0, got {value!r}")
    if not math.isfinite(value) or value <= 0:
        raise UserError(f"{name} must be a finite number of seconds > 0, got {value!r}")
    return float(value)


def _check_session(value: object, *, required: bool = False) -> str | None:
    if value is None and not required:
        return None
    if not isinstance(value, str) or not value:
        raise UserError(f"session_id must be a non-empty str, got {value!r}")
    return value


#: the largest shell state (characters) a copy is given: its request, escaped, must stay
#: well under the 256 MiB a session takes in one request
_MAX_STATE = 48 << 20


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


class ShellService:
    """Run shell commands in persistent, sandboxed sessions, and act on their files.

    Each session is a sandboxed session of the Python executor (same uid,
    rlimits, namespaces, seccomp, Landlock, private ``/tmp``, process budget,
    network mode) whose supervisor runs every command in a fresh ``bash``
    restored from the session's saved shell state: ``cd``, variables,
    functions, aliases and options persist between calls, and exit statuses
    are read by ``waitpid``, never from the command's output. See
    ``docs/shell.md``.

    * ``pool_size``: commands executing at once; ``timeout``: default limit per command.
    * ``max_sessions``: live sessions (LRU eviction beyond it); by default half
      the free memory at 8 MiB a session (256-16,384), sized where the service is
      built. ``max_queue``: calls allowed to wait before
      :class:`~toolservices.ExecutorBusyError`.
    * ``max_output``: bytes kept of stdout and of stderr per command.
    * ``max_file_size``: the largest file ``read_file``/``write_file`` move.
    * ``disk_quota``: bytes a session's workspace may hold (each copy made by
      ``fork_session`` has its own); ``None`` keeps ``sandbox.disk_quota``.
      Needs session namespaces (see ``isolation_report()``); without them
      only ``file_size`` caps each file. With them every workspace is at one
      fixed path (``/workspace`` at L3; the report's ``workspace``).
    * ``sandbox``: a :class:`~toolservices.python.SandboxConfig`. Without one,
      the defaults with ``nproc=256`` (a JVM, ``node`` with workers or a test
      runner's thread pool need more than the executor's 64 tasks); either
      way ``address_space="auto"`` becomes ``"cgroup"``: no ``RLIMIT_AS`` where
      the session's memory cgroup bounds its memory (see ``isolation_report()``).
    * ``command_stack``: the soft stack limit commands start with (``ulimit -s``;
      8 MiB as in a usual terminal, which glibc also gives each thread), up to
      the session's ``stack_size``; ``None`` keeps that. ``ulimit`` changes
      persist between commands like the rest of the shell state.
    * ``network``: ``"loopback"`` (default: each session its own ``lo``; a server
      and its client in one session talk over 127.0.0.1, nothing else is
      reachable), ``"none"`` or ``"host"``; None keeps ``sandbox.network``.
    * ``image_workdir``: whether a new session on an image starts in the image's
      ``WorkingDir`` (the default, as ``docker run``) or, False, in its workspace
      (where relative paths of the file tools land: a harness that writes files
      and then runs them, like the code judge).
    """

    def __init__(
        self,
        pool_size: int = 32,
        timeout: float = 30.0,
        *,
        max_sessions: int | None = None,
        max_queue: int = 4096,
        max_output: int = 128 * 1024,
        max_file_size: int = 16 * 1024 * 1024,
        max_list: int = 10_000,
        disk_quota: int | None = DEFAULT_DISK_QUOTA,
        sandbox: Any = None,
        spares: int = 2,
        command_stack: int | None = COMMAND_STACK,
        network: str | None = None,
        image: str | None = None,
        image_cache: str | None = None,
        insecure_registries: tuple[str, ...] | list[str] = (),
        image_workdir: bool = True,
    ) -> None:
        self.timeout = _check_timeout(timeout)
        if max_output < 1 or max_file_size < 1 or max_list < 1:
            raise UserError("max_output, max_file_size and max_list must be positive")
        self.max_output = int(max_output)
        self.max_file_size = int(max_file_size)
        self.max_list = int(max_list)
        # The supervisor's JSON reply travels as the session's stdout: room for both streams
        # (base64) or one file, plus the envelope.
        config = shell_config(sandbox)
        config = with_network(config, network)
        self._image_args = {
            "image": image,
            "image_cache": image_cache,
            "insecure_registries": tuple(insecure_registries),
        }
        self.image: Image | None = None
        if image is not None:
            self.image = ImageStore(image_cache).pull(
                image, insecure_registries=tuple(insecure_registries)
            )
            if not _has_bash(self.image):
                raise UserError(
                    f"image {image!r} has no /bin/bash (or /usr/bin/bash): ShellService runs "
                    "every command with the image's bash; use an image that has it"
                )
            config = image_config(config, self.image)
        if disk_quota is not None:
            if isinstance(disk_quota, bool) or not isinstance(disk_quota, int) or disk_quota <= 0:
                raise UserError(f"disk_quota must be a positive int or None, got {disk_quota!r}")
            config = dataclasses.replace(config, disk_quota=disk_quota)
        # every session's workspace at one path (where session namespaces allow it)
        # ... and each its own PID namespace and /proc (see docs/shell.md, "Isolation")
        config = dataclasses.replace(config, fixed_workspace=True, own_pids=True)
        reply = max(2 * (4 * (max_output + 2) // 3 + 4), 4 * (max_file_size + 2) // 3 + 4)
        if command_stack is not None and (
            isinstance(command_stack, bool)
            or not isinstance(command_stack, int)
            or command_stack < 1
        ):
            raise UserError(f"command_stack must be a positive int or None, got {command_stack!r}")
        self.command_stack = command_stack
        self.image_workdir = bool(image_workdir)
        # the shell state travels to fork_session copies in parts of this many characters:
        # in the reply's JSON a character takes up to 12 bytes (an escaped surrogate pair)
        self._state_part = max(4096, reply // 12)
        self._config = {
            "max_output": self.max_output,
            "max_file": self.max_file_size,
            "command_stack": command_stack,
            # "loopback" reaches nothing outside the session: pip has no index there either
            "offline": config.network != "host",
            # an image's WorkingDir: where a new session's first command starts
            "start_dir": start_dir(self.image) if image_workdir else None,
            # the bash builtin that lets one live bash serve the commands (shell.md); an
            # image's bash may not be the one it was built for: a bash per command there
            "native": native_library() if self.image is None else None,
            # every reply carries it: a line the session forged cannot (see _reply)
            "token": secrets.token_hex(16),
        }
        self._config_text = repr(self._config)  # in every request's source: written once
        self._max_sessions_arg = max_sessions  # None travels as None: a replica sizes itself
        if max_sessions is None:
            max_sessions = default_max_sessions(
                pool_size=pool_size, session_bytes=SESSION_BYTES, session_fds=SESSION_FDS
            )
        self._python = PythonExecutorService(
            pool_size=pool_size,
            timeout=self.timeout + _GRACE,
            max_sessions=max_sessions,
            max_queue=max_queue,
            max_output=reply + 64 * 1024,
            sandbox=config,
            spares=spares,
            # spare interpreters load the supervisor and start the first bash ahead of need:
            # a new session's first command then finds them ready
            warmup=_BOOTSTRAP + f"{_ENTRY}('warm', {{}}, {self._config_text})\n",
        )
        self.pool_size = pool_size
        self.max_sessions = max_sessions
        self.max_queue = max_queue
        self.sandbox = self._python.sandbox
        self._lock = threading.Lock()
        # sessions whose supervisor is loaded (as far as we know: an evicted one answers
        # NameError and is loaded again), so that their calls skip the bootstrap
        self._booted: set[str] = set()
        # sessions whose state or files were lost in a call that could not say so (a file
        # tool's, or a command whose supervisor died): their next command reports it
        self._lost: dict[str, None] = {}
        self._counters = dict.fromkeys(("commands", "timeouts", "restarts", "failures", "files"), 0)

    # --- requests ------------------------------------------------------------------

    def _code(self, op: str, args: dict[str, Any], boot: bool) -> str:
        call = (
            f"{_ENTRY}({op!r}, __import__('json').loads({json.dumps(args)!r}), {self._config_text})"
        )
        if boot:
            return f"{_BOOTSTRAP}{call}\n"
        # a session without the supervisor says so (no exception: not a failed call)
        return f"if {_ENTRY!r} in globals():\n    {call}\nelse:\n    print({_COLD!r})\n"

    @staticmethod
    def _needs_boot(res: ExecResult) -> bool:
        if res.exception is None:
            return res.stdout.endswith(_COLD + "\n")
        exc = res.exception
        return exc.type == "NameError" and _ENTRY in exc.message

    def _booting(self, session_id: str | None) -> bool:
        # a new session (or a fresh shell) most likely comes from a warmed spare (see
        # ``warmup``), which has the supervisor: try without the bootstrap (68 KB to send
        # and compile); a cold one answers NameError and gets it
        if self._python.spares:
            return False
        return session_id is None or session_id not in self._booted

    def _booted_now(self, session_id: str | None, res: ExecResult) -> None:
        if session_id is not None and res.exception is None:
            if len(self._booted) > 4 * self.max_sessions:
                self._booted.clear()  # forgetting only costs a NameError round trip
            self._booted.add(session_id)

    def _request(
        self, op: str, args: dict[str, Any], session_id: str | None, limit: float
    ) -> tuple[ExecResult, bool]:
        code = self._code(op, args, self._booting(session_id))
        res = self._python.execute(code, session_id=session_id, timeout=limit)
        lost = res.restarted
        if self._needs_boot(res):
            code = self._code(op, args, True)
            res = self._python.execute(code, session_id=session_id, timeout=limit)
            lost = lost or res.restarted
        self._booted_now(session_id, res)
        return res, self._note_lost(session_id, res, lost)

    async def _arequest(
        self, op: str, args: dict[str, Any], session_id: str | None, limit: float
    ) -> tuple[ExecResult, bool]:
        code = self._code(op, args, self._booting(session_id))
        res = await self._python.aexecute(code, session_id=session_id, timeout=limit)
        lost = res.restarted
        if self._needs_boot(res):
            code = self._code(op, args, True)
            res = await self._python.aexecute(code, session_id=session_id, timeout=limit)
            lost = lost or res.restarted
        self._booted_now(session_id, res)
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

    # --- run -------------------------------------------------------------------------

    def _run_args(
        self, command: object, session_id: object, timeout: object, stdin: object
    ) -> tuple[dict[str, Any], str | None, float]:
        if not isinstance(command, str):
            raise UserError(f"command must be a str, got {type(command).__name__}")
        session = _check_session(session_id)
        limit = self.timeout if timeout is None else _check_timeout(timeout)
        if stdin is None:
            data = None
        elif isinstance(stdin, str):
            data = base64.b64encode(encode(stdin, "run", "stdin")).decode()
        elif isinstance(stdin, bytes | bytearray | memoryview):
            data = base64.b64encode(bytes(stdin)).decode()
        else:
            raise UserError(f"stdin must be str, bytes or None, got {type(stdin).__name__}")
        return {"command": command, "timeout": limit, "stdin": data}, session, limit + _GRACE

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

    def _refused(self, command: str, session_id: str | None) -> ShellResult | None:
        """A result for a command bash cannot be given (a NUL, a lone surrogate), or None."""
        why = "a NUL byte" if "\x00" in command else lone_surrogate(command)
        if not why:
            return None
        self._bump(commands=1, failures=1)
        return ShellResult(
            success=False,
            stdout="",
            stderr=f"bash: the command contains {why}; nothing was run\n",
            returncode=2,
            session_id=session_id,
        )

    def run(
        self,
        command: str,
        session_id: str | None = None,
        timeout: float | None = None,
        stdin: str | bytes | None = None,
    ) -> ShellResult:
        """Run ``command`` in session ``session_id``'s shell (created on first use).

        Without a session: in a fresh shell that is discarded afterwards. Never
        raises for what the command does; raises ``ExecutorBusyError`` when
        the queue is full and ``InfrastructureError`` when the machinery fails.
        """
        args, session, limit = self._run_args(command, session_id, timeout, stdin)
        refused = self._refused(command, session)
        if refused is not None:
            return refused
        res, lost = self._request("run", args, session, limit)
        return self._result(res, lost, session)

    async def arun(
        self,
        command: str,
        session_id: str | None = None,
        timeout: float | None = None,  # noqa: ASYNC109 - the command's own limit
        stdin: str | bytes | None = None,
    ) -> ShellResult:
        """Async :meth:`run`."""
        args, session, limit = self._run_args(command, session_id, timeout, stdin)
        refused = self._refused(command, session)
        if refused is not None:
            return refused
        res, lost = await self._arequest("run", args, session, limit)
        return self._result(res, lost, session)

    # --- files -----------------------------------------------------------------------

    def _file_limit(self) -> float:
        return self.timeout + _GRACE

    def _file_reply(self, op: str, path: str, res: ExecResult, **fields: Any) -> dict[str, Any]:
        self._bump(files=1)
        if res.timed_out:
            raise ShellFileError(op, path, "ETIMEDOUT", "the operation timed out")
        reply = self._reply(res)
        if not reply.get("ok"):
            raise ShellFileError(op, path, str(reply.get("errno")), str(reply.get("message")))
        return checked(reply, fields)

    def _write_args(
        self, path: object, data: object, session_id: object
    ) -> tuple[dict[str, Any], str]:
        session = _check_session(session_id, required=True)
        assert session is not None
        path = check_path(path, "write_file")
        if isinstance(data, str):
            raw = encode(data, "write_file", path)
        elif isinstance(data, bytes | bytearray | memoryview):
            raw = bytes(data)
        else:
            raise UserError(f"data must be str or bytes, got {type(data).__name__}")
        if len(raw) > self.max_file_size:
            raise ShellFileError(
                "write_file",
                path,
                "EFBIG",
                f"{len(raw)} bytes exceed the limit of {self.max_file_size}",
            )
        return {"path": path, "data": base64.b64encode(raw).decode()}, session

    def write_file(self, path: str, data: str | bytes, *, session_id: str) -> int:
        """Write ``data`` to ``path`` (relative: in the workspace) as the session would.

        Returns the bytes written; missing parent directories are created.
        """
        args, session = self._write_args(path, data, session_id)
        res, _ = self._request("write", args, session, self._file_limit())
        return int(self._file_reply("write_file", path, res, size=int)["size"])

    async def awrite_file(self, path: str, data: str | bytes, *, session_id: str) -> int:
        """Async :meth:`write_file`."""
        args, session = self._write_args(path, data, session_id)
        res, _ = await self._arequest("write", args, session, self._file_limit())
        return int(self._file_reply("write_file", path, res, size=int)["size"])

    def _path_args(self, path: object, session_id: object, op: str) -> str:
        _check_session(session_id, required=True)
        return check_path(path, op)

    def _decode_read(self, path: str, res: ExecResult, binary: bool) -> str | bytes:
        data = base64.b64decode(self._file_reply("read_file", path, res, data=str)["data"])
        return data if binary else data.decode("utf-8", "replace")

    def read_file(self, path: str, *, session_id: str, binary: bool = False) -> str | bytes:
        """The content of ``path`` as the session sees it (text with replacement, or bytes)."""
        path = self._path_args(path, session_id, "read_file")
        res, _ = self._request("read", {"path": path}, session_id, self._file_limit())
        return self._decode_read(path, res, binary)

    async def aread_file(self, path: str, *, session_id: str, binary: bool = False) -> str | bytes:
        """Async :meth:`read_file`."""
        path = self._path_args(path, session_id, "read_file")
        res, _ = await self._arequest("read", {"path": path}, session_id, self._file_limit())
        return self._decode_read(path, res, binary)

    def _archive_args(self, path: object, data: object, session_id: object) -> dict[str, Any]:
        path = self._path_args(path, session_id, "put_archive")
        if hasattr(data, "read"):
            data = data.read(self.max_file_size + 1)
        if not isinstance(data, bytes | bytearray | memoryview):
            raise UserError(f"tar must be bytes or a binary file, got {type(data).__name__}")
        if len(data) > self.max_file_size:
            raise ShellFileError(
                "put_archive", path, "EFBIG", f"the archive exceeds {self.max_file_size} bytes"
            )
        return {"path": path, "data": base64.b64encode(bytes(data)).decode()}

    def put_archive(self, session_id: str, path: str, tar: bytes | BinaryIO) -> int:
        """Unpack the tar ``tar`` (bytes or a binary file) into directory ``path``, like
        ``docker cp``: the session's rights, at most ``max_file_size`` bytes of archive,
        nothing written if any entry would leave ``path``. Returns the entries unpacked."""
        args = self._archive_args(path, tar, session_id)
        res, _ = self._request("put_archive", args, session_id, self._file_limit())
        return int(self._file_reply("put_archive", args["path"], res, entries=int)["entries"])

    async def aput_archive(self, session_id: str, path: str, tar: bytes | BinaryIO) -> int:
        """Async :meth:`put_archive`."""
        args = self._archive_args(path, tar, session_id)
        res, _ = await self._arequest("put_archive", args, session_id, self._file_limit())
        return int(self._file_reply("put_archive", args["path"], res, entries=int)["entries"])

    def get_archive(self, session_id: str, path: str) -> bytes:
        """A tar of ``path`` (file or directory, links kept as links) as the session sees
        it; at most ``max_file_size`` bytes (else :class:`ShellFileError` EFBIG)."""
        path = self._path_args(path, session_id, "get_archive")
        res, _ = self._request("get_archive", {"path": path}, session_id, self._file_limit())
        return base64.b64decode(self._file_reply("get_archive", path, res, data=str)["data"])

    async def aget_archive(self, session_id: str, path: str) -> bytes:
        """Async :meth:`get_archive`."""
        path = self._path_args(path, session_id, "get_archive")
        res, _ = await self._arequest("get_archive", {"path": path}, session_id, self._file_limit())
        return base64.b64decode(self._file_reply("get_archive", path, res, data=str)["data"])

    def _entries(self, path: str, res: ExecResult) -> list[FileEntry]:
        reply = self._file_reply("list_files", path, res, entries=list)
        try:
            return [entry(str(n), str(k), int(s)) for n, k, s in reply["entries"]]
        except (TypeError, ValueError):
            raise InfrastructureError(
                "the shell session's supervisor sent a malformed reply (entries)", retryable=True
            ) from None

    def list_files(self, path: str = ".", *, session_id: str) -> list[FileEntry]:
        """The entries of directory ``path`` (sorted by name, at most ``max_list``)."""
        path = self._path_args(path, session_id, "list_files")
        args = {"path": path, "limit": self.max_list}
        res, _ = self._request("list", args, session_id, self._file_limit())
        return self._entries(path, res)

    async def alist_files(self, path: str = ".", *, session_id: str) -> list[FileEntry]:
        """Async :meth:`list_files`."""
        path = self._path_args(path, session_id, "list_files")
        args = {"path": path, "limit": self.max_list}
        res, _ = await self._arequest("list", args, session_id, self._file_limit())
        return self._entries(path, res)

    def workspace(self, session_id: str) -> str:
        """The absolute path of the session's workspace (its shell's starting directory)."""
        _check_session(session_id, required=True)
        res, _ = self._request("workspace", {}, session_id, self._file_limit())
        return str(self._reply(res, {"workspace": str})["workspace"])

    # --- sessions ----------------------------------------------------------------------

    def _start_args(self, session_id: object, image: object) -> str:
        session = _check_session(session_id, required=True)
        assert session is not None
        if image is not None and (self.image is None or image != self.image.reference):
            raise UserError(
                f"start_session(image={image!r}): this service's sessions run on "
                f"{self.image.reference if self.image else 'the host view (no image)'}; "
                "one image per ShellService for now (make one service per image)"
            )
        if self._python.has_session(session):
            raise UserError(f"session {session!r} exists already; close it first")
        return session

    def start_session(self, session_id: str, *, image: str | None = None) -> str:
        """Create ``session_id`` now, on the service's image (``image``: None, or the same
        reference); a :class:`UserError` if it exists. Sessions are otherwise created on first
        use. Returns the id."""
        session = self._start_args(session_id, image)
        self.workspace(session)
        return session

    async def astart_session(self, session_id: str, *, image: str | None = None) -> str:
        """Async :meth:`start_session`."""
        session = self._start_args(session_id, image)
        res, _ = await self._arequest("workspace", {}, session, self._file_limit())
        self._reply(res)
        return session

    # A copy is a fresh session (own namespaces, disk quota, process budget, workspace at
    # the same path), seeded with the source's files by the fork server and then given the
    # source's shell state, which is text: no memory of the source is needed.

    def fork_session(self, src: str, n: int = 1) -> list[str]:
        """``n`` copies of session ``src``: its workspace files and shell state; ``src`` runs on."""
        return run_sync(self.afork_session, src, n)

    async def afork_session(self, src: str, n: int = 1) -> list[str]:
        """Async :meth:`fork_session` (which waits for this one on the library's loop)."""
        _check_session(src, required=True)
        copies = await self._python.aspawn_with_files(src, n)  # an unknown source: UserError
        try:
            args = await self._read_state(src)
            for copy in copies:
                if args["state"]:
                    res, lost = await self._arequest("adopt", args, copy, self._file_limit())
                    self._adopted(res, lost)
        except BaseException:
            for copy in copies:
                await self.aclose_session(copy)
            raise
        return copies

    async def _read_state(self, src: str) -> dict[str, Any]:
        """The source's shell state, in parts that each fit one reply (a 23 MB variable)."""
        parts: list[str] = []
        offset, generation, fields = 0, None, {"state": str, "workspace": str, "total": int}
        while True:
            args = {"offset": offset, "limit": self._state_part}
            res, lost = await self._arequest("state", args, src, self._file_limit())
            if lost:  # its files were copied, its state is gone: the copies would mix the two
                raise InfrastructureError(
                    "fork_session: the source session was restarted during the copy",
                    retryable=True,
                )
            reply = self._reply(res, fields)
            if generation is None:
                generation = reply.get("generation")
            elif reply.get("generation") != generation:
                raise InfrastructureError(
                    "fork_session: a command of the source changed its shell state during the "
                    "copy; fork it between its commands",
                    retryable=True,
                )
            parts.append(reply["state"])
            offset += len(reply["state"])
            if offset >= reply["total"] or not reply["state"]:
                break
        state = "".join(parts)
        if len(state) > _MAX_STATE:
            name, size = largest_variable(state)
            raise UserError(
                f"fork_session: the source's shell state is {len(state)} characters, more than "
                f"the {_MAX_STATE} a copy can be given; its largest variable, {name}, holds "
                f"{size}: keep large data in files (which fork_session copies)"
            )
        return {"state": state, "workspace": reply["workspace"], "home": await self._read_home(src)}

    async def _read_home(self, src: str) -> str:
        """The source's private HOME as one archive (base64; "" when it has none)."""
        res, lost = await self._arequest("home", {}, src, self._file_limit())
        if lost:
            raise InfrastructureError(
                "fork_session: the source session was restarted during the copy", retryable=True
            )
        reply = self._reply(res)
        if not reply.get("ok"):
            raise UserError(f"fork_session: {reply.get('message')}")
        return str(reply.get("home", ""))

    def _adopted(self, res: ExecResult, lost: bool) -> None:
        if lost:
            raise InfrastructureError(
                "fork_session: a copy was evicted before it got the shell state "
                "(max_sessions too small for the copies?)",
                retryable=True,
            )
        reply = self._reply(res)
        if not reply.get("ok"):
            raise InfrastructureError(
                f"fork_session: a copy refused the shell state: {reply.get('message')}",
                retryable=False,
            )

    def close_session(self, session_id: str) -> bool:
        """Kill every process the session started and free its files; False: no such session."""
        _check_session(session_id, required=True)
        self._booted.discard(session_id)
        self._reported_lost(session_id)  # its next use is a new session, not a lost one
        return self._python.close_session(session_id)

    async def aclose_session(self, session_id: str) -> bool:
        """Async :meth:`close_session`."""
        _check_session(session_id, required=True)
        self._booted.discard(session_id)
        self._reported_lost(session_id)
        return await self._python.aclose_session(session_id)

    def isolation_report(self) -> dict[str, Any]:
        """The isolation the sessions get: the Python executor's report, plus two shell layers.

        ``disk_quota`` (the workspace tmpfs, which needs session namespaces) and
        ``command_scope`` (commands cannot signal their session's supervisor:
        Landlock ABI >= 6, i.e. the report's ``landlock`` layer with scoping).
        """
        report = dict(self._python.isolation_report())
        layers = dict(report.get("layers", {}))
        own_ns = bool(layers.get("session_namespaces", {}).get("active"))
        quota = self.sandbox.disk_quota
        layers["disk_quota"] = {
            "active": own_ns and quota is not None,
            "detail": f"each session's workspace is a private tmpfs of {quota} bytes"
            if own_ns and quota is not None
            else "off: needs session namespaces and a disk_quota; only file_size caps a file",
        }
        abi = _landlock_abi()
        apart = (
            "; each command's bash has a Landlock domain of its own: no process of another "
            "command (a background job) can open its descriptors or memory "
            "(/proc/<pid>/fd, /proc/<pid>/mem, pidfd_getfd), so none can write the command "
            "pipe or output of the bash waiting for the next command"
            if abi >= 1
            else ""
        )
        layers["command_scope"] = {
            "active": abi >= 6,
            "detail": "commands run in a nested Landlock domain scoped for signals: "
            "they cannot signal their session's supervisor" + apart
            if abi >= 6
            else f"off: needs Landlock ABI >= 6 (this kernel: {abi}); a command can kill "
            "its session's supervisor, which loses the session" + apart,
        }
        # A shell fork_session makes fresh sessions (spawn_with_files), not forks sharing
        # the source's namespaces as the executor's fork_session does: say what is true here.
        nproc = layers.get("nproc_limit")
        if nproc and "detail" in nproc:
            layers["nproc_limit"] = {
                **nproc,
                "detail": nproc["detail"].replace(
                    "its copies from fork_session share it", "each fork_session copy has its own"
                ),
            }
        report["not_protected"] = [
            _SHELL_COPIES if entry.startswith("copies made by fork_session") else entry
            for entry in report.get("not_protected", [])
        ]
        report["layers"] = layers
        if self.image is not None:
            report["image"] = {"reference": self.image.reference, "digest": self.image.digest}
        return report

    def stats(self) -> dict[str, Any]:
        """The executor's counters (sessions, queue, slots) plus the shell's own."""
        out = dict(self._python.stats())
        with self._lock:
            out.update({f"shell_{k}": v for k, v in self._counters.items()})
        return out

    def close(self) -> None:
        """Close every session (killing their processes) and the fork server."""
        self._python.close()

    async def aclose(self) -> None:
        """Async :meth:`close`."""
        await self._python.aclose()

    def __enter__(self) -> ShellService:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    async def __aenter__(self) -> ShellService:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    def __reduce__(self) -> tuple[Callable[..., ShellService], tuple[Any, ...]]:
        return _rebuild, (self._init_kwargs(),)

    def _init_kwargs(self) -> dict[str, Any]:
        return {
            "pool_size": self.pool_size,
            "timeout": self.timeout,
            "max_sessions": self._max_sessions_arg,
            "max_queue": self.max_queue,
            "max_output": self.max_output,
            "max_file_size": self.max_file_size,
            "max_list": self.max_list,
            # the image travels by name: a replica pulls it into its own node's cache
            "sandbox": dataclasses.replace(self.sandbox, root_layers=()),
            **self._image_args,
            "disk_quota": None,
            "spares": self._python.spares,
            "command_stack": self.command_stack,
            "image_workdir": self.image_workdir,
        }


#: What a shell's fork_session copies share (its report says it instead of the executor's).
_SHELL_COPIES = (
    "copies made by fork_session are fresh sessions (own /tmp, /dev/shm, process budget, "
    "disk quota and memory group) that start with a copy of the source's workspace, HOME "
    "and shell state; background processes of the source are not copied"
)


def shell_config(sandbox: object) -> SandboxConfig:
    """The sandbox of a shell service: ``sandbox``, or the defaults with :data:`SHELL_NPROC`;
    ``address_space="auto"`` becomes ``"cgroup"`` (toolchains reserve address space)."""
    config = (
        dataclasses.replace(default_config(), nproc=SHELL_NPROC)
        if sandbox is None
        else check_config(sandbox)
    )
    if config.address_space == "auto":
        config = dataclasses.replace(config, address_space="cgroup")
    # the host's toolchains read their configuration there (a JDK's conf/ links into it)
    wanted = [p for pattern in _TOOLCHAIN_ETC for p in sorted(glob.glob(pattern))]
    extra = tuple(p for p in wanted if p not in config.extra_ro_paths)
    if extra:
        config = dataclasses.replace(config, extra_ro_paths=(*config.extra_ro_paths, *extra))
    return config


def _has_bash(image: Image) -> bool:
    """Whether some layer lays ``bin/bash`` or ``usr/bin/bash`` (a file or a link to one)."""
    return any(
        os.path.lexists(os.path.join(layer, name))
        for layer in image.layers
        for name in ("bin/bash", "usr/bin/bash")
    )


def start_dir(image: Image | None) -> str | None:
    """Where a session on ``image`` starts: its ``WorkingDir``; None (the workspace) when
    it names none or ``/`` (docker's default, the same as none)."""
    if image is None or image.working_dir in ("", "/") or not image.working_dir.startswith("/"):
        return None
    return image.working_dir


def _rebuild(kwargs: dict[str, Any]) -> ShellService:
    return ShellService(**kwargs)
