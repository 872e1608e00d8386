"""``CodeJudge``: SandboxFusion's ``run_code`` / ``run_jupyter`` semantics, and multi-case
``run_tests``, each submission in a fresh sandboxed shell session."""

from __future__ import annotations

import asyncio
import base64
import binascii
import dataclasses
import functools
import hashlib
import json
import logging
import shlex
import threading
import uuid
from collections.abc import Callable, Coroutine, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

from toolservices._portal import run_sync
from toolservices.errors import InfrastructureError, UserError
from toolservices.judge._cache import CompileCache
from toolservices.judge._fastpy import wrap
from toolservices.judge._languages import (
    LANGUAGES,
    PROBE,
    STACK_MB,
    ImageTools,
    Toolchain,
    discover,
    java_flags,
)
from toolservices.judge._results import (
    code_response,
    jupyter_response,
    overall,
    step,
    tests_response,
    verdict,
)
from toolservices.python import ExecResult, PythonExecutorService, SandboxConfig
from toolservices.shell import ShellFileError, ShellResult, ShellService

__all__ = ["CodeJudge"]

log = logging.getLogger(__name__)

T = TypeVar("T")
_MiB = 1 << 20
_COMPILE_STACK_KB = 64 * 1024
_DRIVER = (Path(__file__).parent / "_jupyter_driver.py").read_text("utf-8")


def _head(text: str, cap: int) -> str:
    """The first ``cap`` bytes of a stream, as SandboxFusion reads them.

    The services keep a longer stream's head (and the shell its tail) around a marker
    line; the head they kept is at least ``cap`` bytes once re-encoded (a replaced
    invalid byte only grows), so the cut never reaches the marker.
    """
    if len(text) <= cap // 4:
        return text
    data = text.encode()
    return text if len(data) <= cap else data[:cap].decode("utf-8", "ignore")


def _from_run(res: ShellResult | ExecResult, cap: int) -> dict[str, Any]:
    """A SandboxFusion step result from a shell command's or an interpreter's result."""
    status = "TimeLimitExceeded" if res.timed_out else "Finished"
    out, err = _head(res.stdout, cap), _head(res.stderr, cap)
    return step(status, time=res.duration, rc=res.returncode, out=out, err=err)


def _retryable(exc: Exception) -> bool:
    """Overload (a full queue...): raised for the caller to retry (the server's 504)."""
    return isinstance(exc, InfrastructureError) and exc.retryable


def _check_number(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not value == value:
        raise UserError(f"{name} must be a number of seconds, got {value!r}")
    return float(value)


class _Prepared:
    """What a request brings into its session: decoded files, then the source."""

    def __init__(
        self, toolchain: Toolchain, code: str, files: Mapping[str, str | None] | None
    ) -> None:
        self.toolchain = toolchain
        self.code = code
        self.files: dict[str, bytes] = {}
        for name, content in (files or {}).items():
            if content is None or "IGNORE_THIS_FILE" in name:
                continue
            try:
                self.files[name] = base64.b64decode(content, validate=True)
            except (binascii.Error, ValueError) as exc:
                raise _Refused(f"files[{name!r}] is not valid base64: {exc}") from None

    def cache_key(self) -> str:
        h = hashlib.sha256()
        tc = self.toolchain
        h.update(f"{tc.language}\0{tc.identity}\0{tc.compile}\0".encode())
        h.update(hashlib.sha256(self.code.encode()).digest())
        for name in sorted(self.files):
            h.update(name.encode() + b"\0" + hashlib.sha256(self.files[name]).digest())
        return h.hexdigest()


class _Refused(Exception):
    """A request the judge answers with SandboxError before running anything."""


class CodeJudge:
    """Judge programs in fresh sandboxed sessions (SandboxFusion's semantics, docs/code-judge.md).

    Each submission runs in a session of its own (from warmed spares), which is
    closed afterwards: no files or processes are shared between submissions.

    * ``concurrency``: submission steps running at once (the shell's pool).
    * ``memory_limit_mb``: the most memory (``RLIMIT_AS``) and stack any program
      gets; a request's ``memory_limit_MB`` lowers it, ``-1`` means this cap.
    * ``max_output``: bytes of stdout and of stderr kept per step (SandboxFusion: 1 MiB).
    * ``cache_bytes``: the compile cache's size (artifacts of compiled submissions).
    * ``disk_quota``: bytes a submission's workspace may hold.
    * ``sandbox``: a :class:`~toolservices.python.SandboxConfig` to start from.
    * ``image``: a container image reference (``docs/images.md``): every submission
      runs on its root, with its toolchains (found once, by a probe in one of its
      sessions) instead of the server's; ``image_cache``/``insecure_registries`` as
      for :class:`~toolservices.shell.ShellService`.
    * ``image_python``: with an image, run Python programs that fetch no files as on
      the host, in a fresh interpreter of the Python executor, here the image's own
      ``python3`` (``PythonExecutorService(image=...)``), instead of a shell session
      each (the default). Measured (docs/benchmarks.md): one request at a time it
      answers in a fifth of the time (the interpreter is started ahead of need), but
      it costs more CPU per request (the image's Python imports the runtime at every
      start), so a judge kept busy answers fewer requests a second: True for
      latency, the default for throughput. An image whose ``python3`` the executor
      cannot serve (not CPython >= 3.10) runs them in shell sessions either way.
    """

    def __init__(
        self,
        *,
        concurrency: int = 8,
        memory_limit_mb: int = 4096,
        max_output: int = _MiB,
        cache_bytes: int = 256 * _MiB,
        disk_quota: int = 512 * _MiB,
        sandbox: SandboxConfig | None = None,
        spares: int | None = None,
        image: str | None = None,
        image_cache: str | None = None,
        insecure_registries: Sequence[str] = (),
        image_python: bool = False,
    ) -> None:
        if isinstance(concurrency, bool) or not isinstance(concurrency, int) or concurrency < 1:
            raise UserError(f"concurrency must be an int >= 1, got {concurrency!r}")
        if (
            isinstance(memory_limit_mb, bool)
            or not isinstance(memory_limit_mb, int)
            or memory_limit_mb < 64
        ):
            raise UserError(f"memory_limit_mb must be an int >= 64, got {memory_limit_mb!r}")
        self.concurrency = concurrency
        self.memory_limit_mb = memory_limit_mb
        self.max_output = max_output
        # on the host, toolchains outside the sandbox's view are bound into it; an image
        # brings its own, found once its first session can look
        binds: list[str] = []
        if image is None:
            self.toolchains: dict[str, Toolchain] = {lang: discover(lang) for lang in LANGUAGES}
            binds = sorted({b for t in self.toolchains.values() for b in t.binds})
        config = sandbox if sandbox is not None else SandboxConfig()
        config = dataclasses.replace(
            config,
            memory_limit=memory_limit_mb * _MiB,
            stack_size=memory_limit_mb * _MiB,
            extra_ro_paths=tuple(dict.fromkeys((*config.extra_ro_paths, *binds))),
        )
        self.bound = tuple(binds)
        shell_spares = concurrency if image is not None else max(1, concurrency // 2)
        self._shell = ShellService(
            pool_size=concurrency,
            timeout=60.0,
            max_sessions=max(64, 4 * concurrency),
            # the shell keeps a long stream's first and last halves: its first half is then
            # the stream's first max_output bytes, what SandboxFusion answers (_head)
            max_output=2 * max_output,
            max_file_size=64 * _MiB,
            disk_quota=disk_quota,
            sandbox=config,
            spares=shell_spares if spares is None else spares,
            image=image,
            image_cache=image_cache,
            insecure_registries=tuple(insecure_registries),
            # a submission's files are written into the workspace and run there, whatever
            # the image's WorkingDir (SandboxFusion runs each one in its own directory)
            image_workdir=False,
        )
        # Python programs that fetch no files run without a shell (_fastpy.py), on the
        # host's interpreter or the image's
        self._python: PythonExecutorService | None = None
        try:
            if image is not None:
                self.toolchains = self._probe_image()
            if image is None or (image_python and not self.toolchains["python"].missing):
                self._python = PythonExecutorService(
                    pool_size=concurrency,
                    timeout=60.0,
                    max_sessions=max(64, 4 * concurrency),
                    max_output=max_output,
                    sandbox=dataclasses.replace(config, disk_quota=disk_quota),
                    spares=concurrency if spares is None else spares,
                    image=image,
                    image_cache=image_cache,
                    insecure_registries=tuple(insecure_registries),
                )
                if image is not None:
                    self._python = self._check_image_python(self._python)
        except BaseException:
            self._shell.close()
            if self._python is not None:
                self._python.close()
            raise
        self._cache = CompileCache(max_bytes=cache_bytes)
        self._lock = threading.Lock()
        self._counts: dict[str, int] = {}

    @staticmethod
    def _check_image_python(python: PythonExecutorService) -> PythonExecutorService | None:
        """``python`` if the image's ``python3`` serves it; else None (closed): Python
        programs then run in shell sessions, with whatever ``python3`` the image has."""
        try:
            if python.execute("pass", timeout=30.0).success:
                return python
        except InfrastructureError as exc:
            log.info("the image's python3 cannot serve the executor (%s): shell sessions", exc)
        python.close()
        return None

    def _probe_image(self) -> dict[str, Toolchain]:
        """Each language's toolchain inside the image, found by one session's probe."""
        image = self._shell.image
        assert image is not None
        sid = self._session()
        try:
            res = self._shell.run(PROBE, session_id=sid, timeout=30.0)
        finally:
            self._shell.close_session(sid)
        if res.timed_out or res.returncode != 0:
            raise InfrastructureError(
                f"could not list the toolchains of image {image.reference!r}: the probe "
                f"{'timed out' if res.timed_out else f'exited {res.returncode}'}: "
                f"{res.stderr[-500:]}"
            )
        found = ImageTools.parse(res.stdout, reference=image.reference, digest=image.digest)
        return {lang: discover(lang, image=found) for lang in LANGUAGES}

    # --- helpers ----------------------------------------------------------------------

    def _count(self, key: str, n: int = 1) -> None:
        with self._lock:
            self._counts[key] = self._counts.get(key, 0) + n

    def _toolchain(self, language: object) -> Toolchain:
        if language not in self.toolchains:
            raise UserError(f"language must be one of {', '.join(LANGUAGES)}; got {language!r}")
        return self.toolchains[str(language)]

    @staticmethod
    def _prepare(tc: Toolchain, code: str, files: Mapping[str, str | None] | None) -> _Prepared:
        """The submission made ready for ``tc``; :class:`_Refused` (a SandboxError) when the
        server lacks the language's toolchain or a file is not base64."""
        if tc.missing:
            raise _Refused(
                f"language {tc.language!r} is not available on this server: missing "
                + ", ".join(tc.missing)
            )
        return _Prepared(tc, code, files)

    def available(self) -> dict[str, str]:
        """Each language: ``"ok"``, or what this server lacks to run it."""
        return {
            k: ("missing " + ", ".join(t.missing)) if t.missing else "ok"
            for k, t in self.toolchains.items()
        }

    def _limit_mb(self, memory_limit_mb: int) -> int:
        if memory_limit_mb is None or memory_limit_mb <= 0:
            return self.memory_limit_mb
        return min(int(memory_limit_mb), self.memory_limit_mb)

    def _run_line(self, tc: Toolchain, limit_mb: int, artifacts: Sequence[str]) -> str:
        kb = limit_mb * 1024
        java_vm, _ = java_flags(limit_mb)
        run = tc.command(tc.run, java_flags=java_vm)
        chmod = f"chmod u+x {shlex.join(artifacts)} 2>/dev/null; " if artifacts else ""
        # as SandboxFusion: address space, data and stack all at the memory limit (but
        # thread-heavy runtimes, see STACK_MB)
        stack = min(kb, STACK_MB.get(tc.language, limit_mb) * 1024)
        return f"{chmod}ulimit -v {kb}; ulimit -d {kb}; ulimit -s {stack}; exec {run}"

    async def _write(self, sid: str, prepared: _Prepared) -> None:
        for name, data in prepared.files.items():
            await self._shell.awrite_file(name, data, session_id=sid)
        await self._shell.awrite_file(prepared.toolchain.source, prepared.code, session_id=sid)

    async def _artifacts(self, sid: str, before: set[str]) -> dict[str, bytes] | None:
        out: dict[str, bytes] = {}
        for entry in await self._shell.alist_files(".", session_id=sid):
            if entry.kind == "file" and entry.name not in before:
                try:
                    data = await self._shell.aread_file(entry.name, session_id=sid, binary=True)
                except ShellFileError:
                    return None  # too large to cache: compile again next time
                assert isinstance(data, bytes)
                out[entry.name] = data
        return out

    async def _compile(
        self, sid: str, prepared: _Prepared, compile_timeout: float
    ) -> tuple[dict[str, Any] | None, list[str], dict[str, bytes] | None]:
        """The compile step (or its cached outcome): its result, the names of the artifacts
        it wrote from the cache (none when it compiled here), and the artifacts as the cache
        holds them (None: too large to keep, each later run compiles again)."""
        tc = prepared.toolchain
        if tc.compile is None:
            return None, [], {}
        key = prepared.cache_key()
        hit = self._cache.get(key)
        if hit is not None:
            self._count("compile_cache_hits")
            cached_result, cached = hit
            for name, data in cached.items():
                await self._shell.awrite_file(name, data, session_id=sid)
            return dict(cached_result), list(cached), cached
        self._count("compile_cache_misses")
        before = {*prepared.files, tc.source}
        # the sandbox's own stack limit (as large as its memory cap) would size every
        # compiler thread's stack by it (go build, javac, rustc are multi-threaded); in a
        # subshell: the session's shell keeps its limits between commands, and the run
        # step must still be able to raise the stack to the request's limit
        line = f"(ulimit -s {_COMPILE_STACK_KB}; exec {tc.command(tc.compile)})"
        res = await self._shell.arun(line, session_id=sid, timeout=compile_timeout)
        result = _from_run(res, self.max_output)
        artifacts: dict[str, bytes] | None = {}
        if result["status"] == "Finished" and result["return_code"] == 0:
            artifacts = await self._artifacts(sid, before)
        if artifacts is not None and result["status"] == "Finished":
            self._cache.put(key, result, artifacts)
        return result, [], artifacts

    async def _fetch(self, sid: str, names: Sequence[str]) -> dict[str, str]:
        files: dict[str, str] = {}
        for name in names:
            try:
                data = await self._shell.aread_file(name, session_id=sid, binary=True)
            except ShellFileError:
                continue  # as SandboxFusion: only files that exist come back
            assert isinstance(data, bytes)
            files[name] = base64.b64encode(data).decode()
        return files

    async def _fast(
        self, prepared: _Prepared, stdin: str | None, run_timeout: float, memory_limit_mb: int
    ) -> dict[str, Any]:
        assert self._python is not None
        limit = self._limit_mb(memory_limit_mb) * _MiB
        code = wrap(prepared.code, stdin, prepared.files, limit, limit)
        return _from_run(await self._python.aexecute(code, timeout=run_timeout), self.max_output)

    def _session(self) -> str:
        return f"judge-{uuid.uuid4().hex}"

    # --- run_code ---------------------------------------------------------------------

    async def arun_code(
        self,
        code: str,
        language: str,
        *,
        stdin: str | None = None,
        compile_timeout: float = 10.0,
        run_timeout: float = 10.0,
        memory_limit_MB: int = -1,  # noqa: N803 - SandboxFusion's field name
        files: Mapping[str, str | None] | None = None,
        fetch_files: Sequence[str] = (),
    ) -> dict[str, Any]:
        """SandboxFusion's ``/run_code``: compile (compiled languages), run, fetch files.

        Returns its response as a dict (``status`` Success / Failed / SandboxError,
        ``compile_result``, ``run_result``, ``files`` base64). A language whose
        toolchain this server lacks, bad base64 or a failure of the sandbox answer
        SandboxError with a message saying what went wrong; a full queue raises
        :class:`~toolservices.ExecutorBusyError` (retryable: the server's 504).
        """
        tc = self._toolchain(language)
        compile_timeout = _check_number("compile_timeout", compile_timeout)
        run_timeout = _check_number("run_timeout", run_timeout)
        self._count(f"run_code_{language}")
        try:
            prepared = self._prepare(tc, code, files)
        except _Refused as exc:
            self._count("sandbox_errors")
            return code_response("SandboxError", str(exc))
        if language == "python" and not fetch_files and self._python is not None:
            try:
                run = await self._fast(prepared, stdin, run_timeout, memory_limit_MB)
            except InfrastructureError as exc:
                if exc.retryable:
                    raise
                self._count("sandbox_errors")
                return code_response("SandboxError", f"the sandbox failed: {exc}")
            status, message = overall(None, run)
            self._count(f"status_{status}")
            return code_response(status, message, run_result=run)
        sid = self._session()
        try:
            await self._write(sid, prepared)
            compile_result, artifacts, _ = await self._compile(sid, prepared, compile_timeout)
            run_result = None
            if compile_result is None or (
                compile_result["status"] == "Finished" and compile_result["return_code"] == 0
            ):
                line = self._run_line(tc, self._limit_mb(memory_limit_MB), artifacts)
                res = await self._shell.arun(line, session_id=sid, timeout=run_timeout, stdin=stdin)
                run_result = _from_run(res, self.max_output)
            fetched = await self._fetch(sid, fetch_files)
        except (InfrastructureError, ShellFileError) as exc:
            if _retryable(exc):
                raise
            self._count("sandbox_errors")
            return code_response("SandboxError", f"the sandbox failed: {exc}")
        finally:
            await self._shell.aclose_session(sid)
        status, message = overall(compile_result, run_result)
        self._count(f"status_{status}")
        return code_response(
            status, message, compile_result=compile_result, run_result=run_result, files=fetched
        )

    def run_code(self, code: str, language: str, **kwargs: Any) -> dict[str, Any]:
        """Sync :meth:`arun_code`."""
        return self._sync(functools.partial(self.arun_code, code, language, **kwargs))

    # --- run_jupyter ------------------------------------------------------------------

    async def arun_jupyter(
        self,
        cells: Sequence[str],
        *,
        cell_timeout: float = 0.0,
        total_timeout: float = 45.0,
        memory_limit_MB: int = -1,  # noqa: N803 - SandboxFusion's field name
        files: Mapping[str, str] | None = None,
        fetch_files: Sequence[str] = (),
    ) -> dict[str, Any]:
        """SandboxFusion's ``/run_jupyter``: the cells in one fresh Python process, in order.

        Each cell's stdout, stderr, ``display`` (the last expression's value as
        ``{"text/plain": repr}``) and ``error`` (``ename``, ``evalue``, ``traceback``);
        an error does not stop later cells. ``cell_timeout`` > 0 bounds each cell.
        """
        self._count("run_jupyter")
        tc = self.toolchains["python"]
        nonce = uuid.uuid4().hex
        out_name = f".judge-{nonce}.json"
        spec = {"cells": list(cells), "cell_timeout": float(cell_timeout), "output": out_name}
        driver_files = {"_judge_cells.json": base64.b64encode(json.dumps(spec).encode()).decode()}
        try:
            prepared = _Prepared(tc, _DRIVER, {**(files or {}), **driver_files})
        except _Refused as exc:
            return jupyter_response("SandboxError", str(exc))
        sid = self._session()
        try:
            await self._write(sid, prepared)
            line = self._run_line(tc, self._limit_mb(memory_limit_MB), ())
            res = await self._shell.arun(line, session_id=sid, timeout=float(total_timeout) + 10)
            driver = _from_run(res, self.max_output)
            if driver["status"] != "Finished":
                return jupyter_response("Failed", driver=driver)
            fetched = await self._fetch(sid, [*fetch_files, out_name])
        except (InfrastructureError, ShellFileError) as exc:
            if _retryable(exc):
                raise
            return jupyter_response("SandboxError", f"the sandbox failed: {exc}")
        finally:
            await self._shell.aclose_session(sid)
        raw = fetched.pop(out_name, None)
        if raw is None:
            return jupyter_response("Failed", driver=driver, files=fetched)
        cells_out = json.loads(base64.b64decode(raw))
        return jupyter_response("Success", driver=driver, cells=cells_out, files=fetched)

    def run_jupyter(self, cells: Sequence[str], **kwargs: Any) -> dict[str, Any]:
        """Sync :meth:`arun_jupyter`."""
        return self._sync(functools.partial(self.arun_jupyter, cells, **kwargs))

    # --- run_tests --------------------------------------------------------------------

    async def arun_tests(
        self,
        code: str,
        language: str,
        cases: Sequence[Mapping[str, Any]],
        *,
        compile_timeout: float = 10.0,
        run_timeout: float = 10.0,
        memory_limit_MB: int = -1,  # noqa: N803 - SandboxFusion's field name
        files: Mapping[str, str | None] | None = None,
        float_tolerance: float | None = None,
        stop_on_first_failure: bool = False,
    ) -> dict[str, Any]:
        """One program against N cases: compiled once, cases run at once, a verdict each.

        ``cases``: ``{"stdin", "expected_stdout", "run_timeout"?, "memory_limit_MB"?}``.
        Verdicts: ``accepted``, ``wrong_answer``, ``time_limit``, ``memory_limit``,
        ``runtime_error``, ``compile_error``, ``skipped`` (after a failure with
        ``stop_on_first_failure``), ``sandbox_error``.
        """
        tc = self._toolchain(language)
        compile_timeout = _check_number("compile_timeout", compile_timeout)
        run_timeout = _check_number("run_timeout", run_timeout)
        self._count("run_tests")
        try:
            prepared = self._prepare(tc, code, files)
        except _Refused as exc:
            return tests_response("SandboxError", str(exc), None, [])
        compile_result: dict[str, Any] | None = None
        artifacts: dict[str, bytes] | None = {}
        if tc.compile is not None:  # compiled once, in a session of its own
            sid = self._session()
            try:
                await self._write(sid, prepared)
                compile_result, _, artifacts = await self._compile(sid, prepared, compile_timeout)
            except (InfrastructureError, ShellFileError) as exc:
                return tests_response("SandboxError", f"the sandbox failed: {exc}", None, [])
            finally:
                await self._shell.aclose_session(sid)
        if compile_result is not None and (
            compile_result["status"] != "Finished" or compile_result["return_code"] != 0
        ):
            verdicts = [{"verdict": "compile_error", "run_result": None} for _ in cases]
            return tests_response("Failed", "", compile_result, verdicts)
        # not cacheable (too large): each case compiles on its own
        built = dict(artifacts) if artifacts is not None else {}

        async def one(case: Mapping[str, Any]) -> dict[str, Any]:
            return await self._case(
                prepared,
                built,
                case,
                run_timeout,
                memory_limit_MB,
                compile_timeout,
                float_tolerance,
            )

        tasks = [asyncio.ensure_future(one(c)) for c in cases]
        results: list[dict[str, Any] | None] = [None] * len(tasks)
        index = {t: i for i, t in enumerate(tasks)}
        pending = set(tasks)
        try:
            while pending:
                done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                failed = False
                for t in done:
                    results[index[t]] = t.result()
                    failed = failed or t.result()["verdict"] != "accepted"
                if failed and stop_on_first_failure:
                    break
        finally:
            for t in pending:
                t.cancel()
            if pending:
                await asyncio.gather(*pending, return_exceptions=True)
        verdicts = [
            r if r is not None else {"verdict": "skipped", "run_result": None} for r in results
        ]
        ok = all(v["verdict"] == "accepted" for v in verdicts)
        return tests_response("Success" if ok else "Failed", "", compile_result, verdicts)

    async def _case(
        self,
        prepared: _Prepared,
        built: Mapping[str, bytes],
        case: Mapping[str, Any],
        run_timeout: float,
        memory_limit_mb: int,
        compile_timeout: float,
        tolerance: float | None,
    ) -> dict[str, Any]:
        tc = prepared.toolchain
        limit = int(case.get("memory_limit_MB", memory_limit_mb))
        timeout = _check_number("run_timeout", case.get("run_timeout", run_timeout))
        if tc.language == "python" and self._python is not None:
            try:
                run = await self._fast(prepared, case.get("stdin"), timeout, limit)
            except InfrastructureError as exc:
                return {"verdict": "sandbox_error", "run_result": step("Error", err=str(exc))}
            return {
                "verdict": verdict(run, case.get("expected_stdout"), tolerance),
                "run_result": run,
            }
        sid = self._session()
        try:
            await self._write(sid, prepared)
            names = list(built)
            if tc.compile and not built:
                compile_result, names, _ = await self._compile(sid, prepared, compile_timeout)
                if compile_result is None or compile_result["return_code"] != 0:
                    return {"verdict": "compile_error", "run_result": None}
            for name, data in built.items():
                await self._shell.awrite_file(name, data, session_id=sid)
            res = await self._shell.arun(
                self._run_line(tc, self._limit_mb(limit), names),
                session_id=sid,
                timeout=timeout,
                stdin=case.get("stdin"),
            )
        except (InfrastructureError, ShellFileError) as exc:
            return {"verdict": "sandbox_error", "run_result": step("Error", err=str(exc))}
        finally:
            await self._shell.aclose_session(sid)
        run = _from_run(res, self.max_output)
        return {"verdict": verdict(run, case.get("expected_stdout"), tolerance), "run_result": run}

    def run_tests(
        self, code: str, language: str, cases: Sequence[Mapping[str, Any]], **kwargs: Any
    ) -> dict[str, Any]:
        """Sync :meth:`arun_tests`."""
        return self._sync(functools.partial(self.arun_tests, code, language, cases, **kwargs))

    # --- rewards ----------------------------------------------------------------------

    async def ascore(
        self,
        code: str,
        language: str,
        cases: Sequence[Mapping[str, Any]],
        **kwargs: Any,
    ) -> float:
        """The fraction of ``cases`` accepted (a reward in [0, 1]); 0.0 when nothing could run.

        ``kwargs`` as for :meth:`arun_tests`. A missing toolchain or a sandbox
        failure scores 0.0 like a wrong answer, never raises for what the code does.
        """
        if not cases:
            raise UserError("cases must hold at least one case to score against")
        result = await self.arun_tests(code, language, cases, **kwargs)
        return float(result["accepted"]) / len(cases)

    def score(
        self, code: str, language: str, cases: Sequence[Mapping[str, Any]], **kwargs: Any
    ) -> float:
        """Sync :meth:`ascore`."""
        return self._sync(functools.partial(self.ascore, code, language, cases, **kwargs))

    # --- lifecycle --------------------------------------------------------------------

    def isolation_report(self) -> dict[str, Any]:
        """The sessions' report, plus ``toolchains_bound``: host directories bound read-only."""
        report = dict(self._shell.isolation_report())
        report["toolchains_bound"] = list(self.bound)
        return report

    def stats(self) -> dict[str, Any]:
        """Counters: requests per language and status, compile cache, the shell's own."""
        with self._lock:
            out: dict[str, Any] = dict(self._counts)
        out.update(self._cache.stats())
        out.update(self._shell.stats())
        if self._python is not None:
            out.update({f"python_{k}": v for k, v in self._python.stats().items()})
        return out

    async def astats(self) -> dict[str, Any]:
        """Async :meth:`stats` (what the server's ``/metrics`` awaits)."""
        return self.stats()

    @staticmethod
    def _sync(call: Callable[[], Coroutine[Any, Any, T]]) -> T:
        return run_sync(call)

    async def aclose(self) -> None:
        """Close every session and the sandboxes' fork servers."""
        try:
            await self._shell.aclose()
        finally:
            if self._python is not None:
                await self._python.aclose()

    def close(self) -> None:
        """Sync :meth:`aclose`."""
        try:
            self._shell.close()
        finally:
            if self._python is not None:
                self._python.close()

    def __enter__(self) -> CodeJudge:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    async def __aenter__(self) -> CodeJudge:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()
