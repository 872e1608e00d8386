"""``ShellService``: persistent shell sessions on the Python executor's sandboxed sessions."""

from __future__ import annotations

import base64
import dataclasses
import secrets
from collections.abc import Callable
from typing import Any, BinaryIO

from toolservices._portal import run_inline, run_sync
from toolservices.errors import InfrastructureError, UserError
from toolservices.images import Image, ImageStore
from toolservices.python import ExecResult, PythonExecutorService
from toolservices.python.host import (
    IMAGE_SPARES,
    check_timeout,
    default_max_sessions,
    pull_image,
)
from toolservices.python.sandbox import with_network
from toolservices.shell._checks import check_path, encode, entry, largest_variable, lone_surrogate
from toolservices.shell._config import (
    COMMAND_STACK,
    DEFAULT_DISK_QUOTA,
    GRACE,
    SESSION_BYTES,
    SESSION_FDS,
    check_session,
    session_sandbox,
    shell_config,
)
from toolservices.shell._images import SessionImages, check_image_spares, start_dir
from toolservices.shell._native import session_library
from toolservices.shell._pycall import arun_python, forget_python, python_config
from toolservices.shell._report import shell_report
from toolservices.shell._requests import SupervisorRequests, preload_code, warmup_code
from toolservices.shell._result import FileEntry, ShellFileError, ShellResult

__all__ = ["ShellService"]

#: the largest shell state (characters) a copy is given: its request, escaped, must stay
#: well under the 256 MiB a session takes in one request
_MAX_STATE = 48 << 20


class ShellService(SupervisorRequests):
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
    * ``image_spares``: how many other images than the service's (the last ones
      ``start_session(image=...)`` used) keep one warm spare each, so that the
      next session on such an image starts like one on the service's image
      (docs/images.md); none with ``spares=0``.
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
        image_spares: int = IMAGE_SPARES,
    ) -> None:
        self.timeout = check_timeout(timeout)
        if max_output < 1 or max_file_size < 1 or max_list < 1:
            raise UserError("max_output, max_file_size and max_list must be positive")
        self.max_output = int(max_output)
        self.max_file_size = int(max_file_size)
        self.max_list = int(max_list)
        config = with_network(shell_config(sandbox), network)
        self.image, self._image_args = pull_image(
            image, image_cache=image_cache, insecure_registries=insecure_registries
        )
        config = session_sandbox(config, image=self.image, reference=image, disk_quota=disk_quota)
        # sessions on other images (start_session(image=...)) stack layers of this cache
        self._images = SessionImages(
            ImageStore(image_cache),
            default=self.image,
            insecure_registries=tuple(insecure_registries),
        )
        config = self._images.with_cache(config)
        # The supervisor's JSON reply travels as the session's stdout: room for both streams
        # (base64) or one file, plus the envelope.
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
        self._init_requests(
            {
                "max_output": self.max_output,
                "max_file": self.max_file_size,
                "command_stack": command_stack,
                # "loopback" reaches nothing outside the session: pip has no index there either
                "offline": config.network != "host",
                # an image's WorkingDir: where a new session's first command starts
                "start_dir": start_dir(self.image) if image_workdir else None,
                # the bash builtin that lets one live bash serve the commands (shell.md); an
                # image's bash may not be the one it was built for: a bash per command there
                "native": session_library(on_image=self.image is not None),
                # every reply carries it: a line the session forged cannot (see _reply)
                "token": secrets.token_hex(16),
                # the Python tool's interpreter: None forks the supervisor, else the image's
                "python": python_config(self.image),
            }
        )
        self._max_sessions_arg = max_sessions  # None travels as None: a replica sizes itself
        if max_sessions is None:
            max_sessions = default_max_sessions(
                pool_size=pool_size, session_bytes=SESSION_BYTES, session_fds=SESSION_FDS
            )
        self._python = PythonExecutorService(
            pool_size=pool_size,
            timeout=self.timeout + GRACE,
            max_sessions=max_sessions,
            max_queue=max_queue,
            max_output=reply + 64 * 1024,
            sandbox=config,
            spares=spares,
            # the fork server loads the supervisor's modules once: sessions share its pages
            preload_code=preload_code(),
            # spare interpreters load the supervisor and start the first bash ahead of need:
            # a new session's first command then finds them ready
            warmup=warmup_code(self._config_json),
        )
        self._python.image_spares = check_image_spares(image_spares)
        self.pool_size = pool_size
        self.max_sessions = max_sessions
        self.max_queue = max_queue
        self.sandbox = self._python.sandbox

    # --- run -------------------------------------------------------------------------

    def _run_args(
        self, command: object, session_id: object, timeout: object, stdin: object
    ) -> tuple[dict[str, Any], str | None, float]:
        if not isinstance(command, str):
            raise UserError(f"command must be a str, got {type(command).__name__}")
        session = check_session(session_id)
        limit = self.timeout if timeout is None else check_timeout(timeout)
        if stdin is None:
            data = None
        elif isinstance(stdin, str):
            data = base64.b64encode(encode(stdin, "run", "stdin")).decode()
        elif isinstance(stdin, bytes | bytearray | memoryview):
            data = base64.b64encode(bytes(stdin)).decode()
        else:
            raise UserError(f"stdin must be str, bytes or None, got {type(stdin).__name__}")
        return {"command": command, "timeout": limit, "stdin": data}, session, limit + GRACE

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
        return run_inline(self._run(command, session_id, timeout, stdin, True))

    async def arun(
        self,
        command: str,
        session_id: str | None = None,
        timeout: float | None = None,  # noqa: ASYNC109 - the command's own limit
        stdin: str | bytes | None = None,
    ) -> ShellResult:
        """Async :meth:`run`."""
        return await self._run(command, session_id, timeout, stdin, False)

    async def _run(
        self,
        command: str,
        session_id: str | None,
        timeout: float | None,  # noqa: ASYNC109 - the command's own limit
        stdin: str | bytes | None,
        inline: bool,
    ) -> ShellResult:
        args, session, limit = self._run_args(command, session_id, timeout, stdin)
        refused = self._refused(command, session)
        if refused is not None:
            return refused
        res, lost = await self._request("run", args, session, limit, inline)
        return self._result(res, lost, session)

    # --- python: the Python tool in the session (_pycall, _pyworker) -----------------

    def run_python(
        self, code: str, session_id: str | None = None, timeout: float | None = None
    ) -> ExecResult:
        """Run Python ``code`` in session ``session_id``'s own interpreter (the executor's
        result): the session's root, workspace, network and processes, so a file the code
        writes is the one ``bash`` sees (see docs/episodes.md). Started on first use and kept
        between calls; a timeout kills only it. Without a session: a fresh one, discarded."""
        return run_inline(arun_python(self, code, session_id, timeout, True))

    async def arun_python(
        self,
        code: str,
        session_id: str | None = None,
        timeout: float | None = None,  # noqa: ASYNC109 - the code's own limit
    ) -> ExecResult:
        """Async :meth:`run_python`."""
        return await arun_python(self, code, session_id, timeout, False)

    def _python_args(self, session_id: object, timeout: object) -> tuple[str | None, float, float]:
        """The session, the code's limit and how long the supervisor has to answer."""
        limit = self.timeout if timeout is None else check_timeout(timeout)
        return check_session(session_id), limit, limit + GRACE

    # --- files -----------------------------------------------------------------------

    def _file_limit(self) -> float:
        return self.timeout + GRACE

    def _write_args(
        self, path: object, data: object, session_id: object
    ) -> tuple[dict[str, Any], str]:
        session = check_session(session_id, required=True)
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
        return run_inline(self._write_file(path, data, session_id, True))

    async def awrite_file(self, path: str, data: str | bytes, *, session_id: str) -> int:
        """Async :meth:`write_file`."""
        return await self._write_file(path, data, session_id, False)

    async def _write_file(self, path: str, data: str | bytes, session_id: str, inline: bool) -> int:
        args, session = self._write_args(path, data, session_id)
        res, _ = await self._request("write", args, session, self._file_limit(), inline)
        return int(self._file_reply("write_file", path, res, size=int)["size"])

    def _path_args(self, path: object, session_id: object, op: str) -> str:
        check_session(session_id, required=True)
        return check_path(path, op)

    def read_file(self, path: str, *, session_id: str, binary: bool = False) -> str | bytes:
        """The content of ``path`` as the session sees it (text with replacement, or bytes)."""
        return run_inline(self._read_file(path, session_id, binary, True))

    async def aread_file(self, path: str, *, session_id: str, binary: bool = False) -> str | bytes:
        """Async :meth:`read_file`."""
        return await self._read_file(path, session_id, binary, False)

    async def _read_file(
        self, path: str, session_id: str, binary: bool, inline: bool
    ) -> str | bytes:
        path = self._path_args(path, session_id, "read_file")
        res, _ = await self._request("read", {"path": path}, session_id, self._file_limit(), inline)
        data = base64.b64decode(self._file_reply("read_file", path, res, data=str)["data"])
        return data if binary else data.decode("utf-8", "replace")

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
        return run_inline(self._put_archive(session_id, path, tar, True))

    async def aput_archive(self, session_id: str, path: str, tar: bytes | BinaryIO) -> int:
        """Async :meth:`put_archive`."""
        return await self._put_archive(session_id, path, tar, False)

    async def _put_archive(
        self, session_id: str, path: str, tar: bytes | BinaryIO, inline: bool
    ) -> int:
        args = self._archive_args(path, tar, session_id)
        res, _ = await self._request("put_archive", args, session_id, self._file_limit(), inline)
        return int(self._file_reply("put_archive", args["path"], res, entries=int)["entries"])

    def get_archive(self, session_id: str, path: str) -> bytes:
        """A tar of ``path`` (file or directory, links kept as links) as the session sees
        it; at most ``max_file_size`` bytes (else :class:`ShellFileError` EFBIG)."""
        return run_inline(self._get_archive(session_id, path, True))

    async def aget_archive(self, session_id: str, path: str) -> bytes:
        """Async :meth:`get_archive`."""
        return await self._get_archive(session_id, path, False)

    async def _get_archive(self, session_id: str, path: str, inline: bool) -> bytes:
        path = self._path_args(path, session_id, "get_archive")
        args = {"path": path}
        res, _ = await self._request("get_archive", args, session_id, self._file_limit(), inline)
        return base64.b64decode(self._file_reply("get_archive", path, res, data=str)["data"])

    def list_files(self, path: str = ".", *, session_id: str) -> list[FileEntry]:
        """The entries of directory ``path`` (sorted by name, at most ``max_list``)."""
        return run_inline(self._list_files(path, session_id, True))

    async def alist_files(self, path: str = ".", *, session_id: str) -> list[FileEntry]:
        """Async :meth:`list_files`."""
        return await self._list_files(path, session_id, False)

    async def _list_files(self, path: str, session_id: str, inline: bool) -> list[FileEntry]:
        path = self._path_args(path, session_id, "list_files")
        args = {"path": path, "limit": self.max_list}
        res, _ = await self._request("list", args, session_id, self._file_limit(), inline)
        reply = self._file_reply("list_files", path, res, entries=list)
        try:
            return [entry(str(n), str(k), int(s)) for n, k, s in reply["entries"]]
        except (TypeError, ValueError):
            raise InfrastructureError(
                "the shell session's supervisor sent a malformed reply (entries)", retryable=True
            ) from None

    def workspace(self, session_id: str) -> str:
        """The absolute path of the session's workspace (its shell's starting directory)."""
        return run_inline(self._workspace(session_id, True))

    async def aworkspace(self, session_id: str) -> str:
        """Async :meth:`workspace`."""
        return await self._workspace(session_id, False)

    async def _workspace(self, session_id: str, inline: bool) -> str:
        session = check_session(session_id, required=True)
        res, _ = await self._request("workspace", {}, session, self._file_limit(), inline)
        return str(self._reply(res, {"workspace": str})["workspace"])

    # --- sessions ----------------------------------------------------------------------

    def _start_args(self, session_id: object) -> str:
        session = check_session(session_id, required=True)
        assert session is not None
        if self._python.has_session(session) or session in self._images.sessions:
            raise UserError(f"session {session!r} exists already; close it first")
        return session

    def start_session(self, session_id: str, *, image: str | None = None) -> str:
        """Create ``session_id`` now, on the service's image (``image``: None, or the same
        reference); a :class:`UserError` if it exists. Sessions are otherwise created on first
        use. Returns the id."""
        return run_inline(self._start_session(session_id, image, True))

    async def astart_session(self, session_id: str, *, image: str | None = None) -> str:
        """Async :meth:`start_session`."""
        return await self._start_session(session_id, image, False)

    async def _start_session(self, session_id: str, image: str | None, inline: bool) -> str:
        session = self._start_args(session_id)
        if image is not None:
            pulled = self._images.pull(image) if inline else await self._images.apull(image)
            self._on_image(session, pulled)
        try:
            await self._workspace(session, inline)
        except BaseException:
            await self._close_session(session, inline)
            raise
        return session

    def _on_image(self, session: str, image: Image | None) -> None:
        """Put ``session`` on ``image`` (None: the service's): the executor spawns its
        interpreters on it, and its requests carry a configuration with its WorkingDir."""
        if image is not None:
            here = start_dir(image) if self.image_workdir else None
            roots = self._python.session_roots
            # its own WorkingDir, bash builtin and python3 (for the Python tool)
            config = {
                **self._config,
                "start_dir": here,
                "native": session_library(on_image=True),
                "python": python_config(image),
            }
            self._images.put(session, image, config, roots)
            roots[session] = self._images.root(image)

    # A copy is a fresh session (own namespaces, disk quota, process budget, workspace at
    # the same path), seeded with the source's files by the fork server and then given the
    # source's shell state, which is text: no memory of the source is needed.

    def fork_session(self, src: str, n: int = 1) -> list[str]:
        """``n`` copies of session ``src``: its workspace files and shell state; ``src`` runs on."""
        return run_sync(self.afork_session, src, n)

    async def afork_session(self, src: str, n: int = 1) -> list[str]:
        """Async :meth:`fork_session` (which waits for this one on the library's loop)."""
        check_session(src, required=True)
        copies = await self._python.aspawn_with_files(src, n)  # an unknown source: UserError
        self._images.copied(src, copies)
        try:
            args = await self._read_state(src)
            for copy in copies:
                if args["state"]:
                    res, lost = await self._request("adopt", args, copy, self._file_limit(), False)
                    self._adopted(res, lost)
            await forget_python(self, src, copies)  # a copy's Python starts fresh and says so
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
            res, lost = await self._request("state", args, src, self._file_limit(), False)
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
        res, lost = await self._request("home", {}, src, self._file_limit(), False)
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
        return run_inline(self._close_session(session_id, True))

    async def aclose_session(self, session_id: str) -> bool:
        """Async :meth:`close_session`."""
        return await self._close_session(session_id, False)

    async def _close_session(self, session_id: str, inline: bool) -> bool:
        check_session(session_id, required=True)
        self._reported_lost(session_id)  # its next use is a new session, not a lost one
        self._images.sessions.pop(session_id, None)
        self._python_lost(session_id, started=False)  # and its next Python call a new one
        if inline:
            return self._python.close_session(session_id)
        return await self._python.aclose_session(session_id)

    def isolation_report(self) -> dict[str, Any]:
        """The isolation the sessions get: the Python executor's report, plus two shell layers
        (see :func:`~toolservices.shell._report.shell_report`) and the image."""
        report = shell_report(self._python.isolation_report(), disk_quota=self.sandbox.disk_quota)
        if self.image is not None:
            report["image"] = {"reference": self.image.reference, "digest": self.image.digest}
        # the sessions started on another image (start_session(image=...)), by id
        report["session_images"] = self._images.report()
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
            "sandbox": dataclasses.replace(self.sandbox, root_layers=(), image_caches=()),
            **self._image_args,
            "disk_quota": None,
            "spares": self._python.spares,
            "command_stack": self.command_stack,
            "image_workdir": self.image_workdir,
            "image_spares": self._python.image_spares,
        }


def _rebuild(kwargs: dict[str, Any]) -> ShellService:
    return ShellService(**kwargs)
