"""``toolservices serve --sandbox-fusion``: SandboxFusion's HTTP API on a :class:`CodeJudge`.

``POST /run_code``, ``POST /run_jupyter``, ``GET /v1/ping`` as SandboxFusion answers them;
``POST /run_tests`` and ``GET /metrics`` (Prometheus text) beyond it. Every request is
answered within its own time budget (compile + run timeout + 10 s, verl's HTTP timeout):
a request that cannot start in time, or that the judge could not finish in it, gets 504,
the one status verl's client retries.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import sys
import time
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

import uvicorn
from pydantic import BaseModel
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from toolservices.errors import InfrastructureError, UserError, describe_exception
from toolservices.judge._admission import Admission
from toolservices.judge._judge import CodeJudge
from toolservices.judge._results import code_response, jupyter_response, tests_response
from toolservices.judge._schema import (
    RunCodeRequest,
    RunJupyterRequest,
    RunTestsRequest,
    parse_body,
)

__all__ = ["ReadyServer", "build_app", "serve_judge"]

logger = logging.getLogger(__name__)
#: what verl adds to compile + run timeout for its HTTP timeout; we answer before it
_SLACK = 10.0
#: kept back from the budget for the answer to travel
_MARGIN = 1.0
#: the clients' header naming who they are, for fairness (else their address)
CLIENT_HEADER = "x-client-id"


class Judge(Protocol):
    """What the server needs of a judge: a local :class:`CodeJudge` or Ray replicas."""

    concurrency: int

    @property
    def arun_code(self) -> Callable[..., Awaitable[dict[str, Any]]]: ...

    @property
    def arun_jupyter(self) -> Callable[..., Awaitable[dict[str, Any]]]: ...

    @property
    def arun_tests(self) -> Callable[..., Awaitable[dict[str, Any]]]: ...

    async def astats(self) -> dict[str, Any]: ...


class _Metrics:
    def __init__(self) -> None:
        self.requests: dict[tuple[str, int], int] = {}
        self.seconds: dict[str, float] = {}

    def record(self, path: str, status: int, seconds: float) -> None:
        self.requests[(path, status)] = self.requests.get((path, status), 0) + 1
        self.seconds[path] = self.seconds.get(path, 0.0) + seconds

    def text(self, admission: Admission, stats: dict[str, Any]) -> str:
        lines = [
            "# HELP toolservices_judge_requests_total HTTP requests answered, by path and status.",
            "# TYPE toolservices_judge_requests_total counter",
        ]
        for (path, status), n in sorted(self.requests.items()):
            lines.append(f'toolservices_judge_requests_total{{path="{path}",code="{status}"}} {n}')
        lines += [
            "# HELP toolservices_judge_request_seconds_total Time spent answering, by path.",
            "# TYPE toolservices_judge_request_seconds_total counter",
        ]
        for path, s in sorted(self.seconds.items()):
            lines.append(f'toolservices_judge_request_seconds_total{{path="{path}"}} {s:.6f}')
        gauges: dict[str, float] = {
            "running": admission.running,
            "waiting": admission.waiting,
            "concurrency": admission.concurrency,
            "max_queue": admission.max_queue,
            "rejected_total": admission.rejected,
        }
        for key, value in stats.items():
            if isinstance(value, int | float) and not isinstance(value, bool):
                gauges[key] = value
        for key, value in gauges.items():
            kind = "counter" if key.endswith("_total") else "gauge"
            lines.append(f"# TYPE toolservices_judge_{key} {kind}")
            lines.append(f"toolservices_judge_{key} {value}")
        return "\n".join(lines) + "\n"


def _busy(what: str) -> JSONResponse:
    return JSONResponse({"detail": what}, status_code=504)


def build_app(
    judge: Judge, *, max_queue: int = 1024, max_wait: float = 5.0, slack: float = _SLACK
) -> Starlette:
    """The ASGI app: routes, validation, admission and deadlines around ``judge``.

    A request's budget is its timeouts plus ``slack`` (verl's 10 s), less one second.
    """
    admission = Admission(concurrency=judge.concurrency, max_queue=max_queue, max_wait=max_wait)
    metrics = _Metrics()

    async def judged(
        request: Request,
        model: type[BaseModel],
        budget: Callable[[Any], float],
        call: Callable[[Any], Awaitable[dict[str, Any]]],
        error: Callable[[str], dict[str, Any]],
    ) -> Response:
        start = time.monotonic()
        body, problems = parse_body(model, await request.body())
        if body is None:
            return JSONResponse(problems, status_code=422)
        deadline = start + budget(body) - _MARGIN
        client = request.headers.get(CLIENT_HEADER) or (
            request.client.host if request.client else "-"
        )
        wait = min(max_wait, max(0.0, deadline - time.monotonic() - 1.0))
        if not await admission.enter(client, wait):
            return _busy("the judge is busy: no slot within the request's time budget; retry")
        try:
            answer = await asyncio.wait_for(call(body), max(0.1, deadline - time.monotonic()))
        except asyncio.TimeoutError:
            return _busy("the judge could not finish the request within its time budget; retry")
        except InfrastructureError as exc:
            if exc.retryable:
                return _busy(f"the judge is overloaded ({exc}); retry")
            answer = error(f"the sandbox failed: {exc}")
        except UserError as exc:  # a value the schema lets through (a negative timeout...)
            answer = error(str(exc))
        except Exception as exc:  # as SandboxFusion: an answer, never a 500 (verl scores -1)
            logger.exception("the judge failed on a request")
            answer = error(f"the judge failed: {describe_exception(exc)}")
        finally:
            admission.leave()
        return JSONResponse(answer)

    def timed(
        handler: Callable[[Request], Awaitable[Response]],
    ) -> Callable[[Request], Awaitable[Response]]:
        async def wrapped(request: Request) -> Response:
            start = time.monotonic()
            response = await handler(request)
            metrics.record(request.url.path, response.status_code, time.monotonic() - start)
            return response

        return wrapped

    def code_error(message: str) -> dict[str, Any]:
        return code_response("SandboxError", message)

    async def run_code(request: Request) -> Response:
        def call(r: RunCodeRequest) -> Awaitable[dict[str, Any]]:
            return judge.arun_code(
                r.code,
                r.language,
                stdin=r.stdin,
                compile_timeout=r.compile_timeout,
                run_timeout=r.run_timeout,
                memory_limit_MB=r.memory_limit_MB,
                files=r.files,
                fetch_files=r.fetch_files,
            )

        return await judged(
            request,
            RunCodeRequest,
            lambda r: r.compile_timeout + r.run_timeout + slack,
            call,
            code_error,
        )

    async def run_jupyter(request: Request) -> Response:
        def call(r: RunJupyterRequest) -> Awaitable[dict[str, Any]]:
            return judge.arun_jupyter(
                r.cells,
                cell_timeout=r.cell_timeout,
                total_timeout=r.total_timeout,
                memory_limit_MB=r.memory_limit_MB,
                files=r.files,
                fetch_files=r.fetch_files,
            )

        def error(message: str) -> dict[str, Any]:
            return jupyter_response("SandboxError", message)

        return await judged(
            request, RunJupyterRequest, lambda r: r.total_timeout + 2 * slack, call, error
        )

    async def run_tests(request: Request) -> Response:
        def call(r: RunTestsRequest) -> Awaitable[dict[str, Any]]:
            return judge.arun_tests(
                r.code,
                r.language,
                [c.model_dump(exclude_none=True) for c in r.cases],
                compile_timeout=r.compile_timeout,
                run_timeout=r.run_timeout,
                memory_limit_MB=r.memory_limit_MB,
                files=r.files,
                float_tolerance=r.float_tolerance,
                stop_on_first_failure=r.stop_on_first_failure,
            )

        def budget(r: RunTestsRequest) -> float:
            # cases run judge.concurrency at a time
            longest = max([c.run_timeout or r.run_timeout for c in r.cases] or [0.0])
            waves = -(-len(r.cases) // judge.concurrency)
            return r.compile_timeout + longest * max(1, waves) + slack

        def error(message: str) -> dict[str, Any]:
            return tests_response("SandboxError", message)

        return await judged(request, RunTestsRequest, budget, call, error)

    async def ping(request: Request) -> Response:
        return JSONResponse("pong")

    async def prometheus(request: Request) -> Response:
        stats = await judge.astats()
        return PlainTextResponse(
            metrics.text(admission, stats), media_type="text/plain; version=0.0.4"
        )

    return Starlette(
        routes=[
            Route("/run_code", timed(run_code), methods=["POST"]),
            Route("/run_jupyter", timed(run_jupyter), methods=["POST"]),
            Route("/run_tests", timed(run_tests), methods=["POST"]),
            Route("/v1/ping", ping, methods=["GET"]),
            Route("/metrics", prometheus, methods=["GET"]),
        ]
    )


class ReadyServer(uvicorn.Server):
    """uvicorn that calls ``on_ready`` once it listens (a test waits for that)."""

    def __init__(self, config: uvicorn.Config, on_ready: Callable[[], None]) -> None:
        super().__init__(config)
        self.on_ready = on_ready

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets=sockets)
        if not self.should_exit:
            self.on_ready()


def serve_judge(
    *,
    host: str = "127.0.0.1",
    port: int = 8080,
    concurrency: int = 8,
    max_queue: int = 1024,
    max_wait: float = 5.0,
    memory_limit_mb: int = 4096,
    ray: str | None = None,
    ray_namespace: str = "toolservices-judge",
    image: str | None = None,
    image_cache: str | None = None,
    insecure_registries: tuple[str, ...] = (),
) -> int:
    """Serve until SIGINT/SIGTERM; the judge's sessions are closed on the way out.

    Prints ``toolservices judge ready: http://HOST:PORT`` on stderr once it listens
    (``port=0`` picks a free port). With ``ray`` (a cluster address), the requests go
    to judge replicas on the cluster, one per node (``_remote.py``). With ``image``, every
    submission runs on that image's root (each replica pulls it). Returns the exit status.
    """
    judge: Judge
    local: CodeJudge | None = None
    options: dict[str, Any] = {"concurrency": concurrency, "memory_limit_mb": memory_limit_mb}
    if image is not None:
        options.update(
            image=image, image_cache=image_cache, insecure_registries=insecure_registries
        )
    if ray is not None:
        from toolservices.judge._remote import ray_judge

        judge = ray_judge(ray, namespace=ray_namespace, **options)
    else:
        try:
            judge = local = CodeJudge(**options)
        except (UserError, InfrastructureError) as exc:
            print(f"toolservices serve: {exc}", file=sys.stderr)
            return 2
    try:
        app = build_app(judge, max_queue=max_queue, max_wait=max_wait)
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError as exc:
            sock.close()
            print(f"toolservices serve: cannot listen on {host}:{port}: {exc}", file=sys.stderr)
            return 2
        bound = sock.getsockname()[1]
        # the asyncio loop: judges run in its tasks; no access log per request
        config = uvicorn.Config(app, loop="asyncio", log_level="warning", access_log=False)
        where = f"http://{host}:{bound}"
        server = ReadyServer(
            config, lambda: print(f"toolservices judge ready: {where}", file=sys.stderr, flush=True)
        )
        asyncio.run(server.serve(sockets=[sock]))
    finally:
        if local is not None:
            local.close()
    return 0
