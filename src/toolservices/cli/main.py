"""Entry point of the ``toolservices`` command."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence

__all__ = ["main"]


def _build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="toolservices",
        description="Execute LLM tool calls for batches of RL environments.",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    demo = commands.add_parser(
        "demo", help="run a batch of scripted tool-using episodes in eight model formats"
    )
    demo.add_argument(
        "--repeats", type=int, default=1, help="episodes per format and scenario (default 1: 32)"
    )
    demo.add_argument(
        "--server",
        metavar="URL",
        help="play the scenarios against an OpenAI-compatible endpoint (e.g. http://host:8000/v1)",
    )
    demo.add_argument("--model", help="the model name the server serves (with --server)")
    demo.add_argument(
        "--parser",
        help="parse tool calls from the raw text in this format (with --server; "
        "default: the server's tool_calls)",
    )
    demo.add_argument("--api-key", help="API key for --server (default: $OPENAI_API_KEY)")
    check = commands.add_parser(
        "sandbox-check", help="report which isolation layers the Python sandbox can use here"
    )
    check.add_argument("--json", action="store_true", help="print the report as JSON")
    check.add_argument(
        "--self-test",
        action="store_true",
        help="also run small, capped hostile snippets and say whether each layer held",
    )
    serve = commands.add_parser("serve", help="serve tools over a protocol")
    protocol = serve.add_mutually_exclusive_group(required=True)
    protocol.add_argument("--mcp", action="store_true", help="serve as an MCP server")
    protocol.add_argument(
        "--sandbox-fusion",
        action="store_true",
        help="serve a code judge with SandboxFusion's HTTP API (/run_code, /run_jupyter, "
        "/v1/ping) plus /run_tests and /metrics; see docs/code-judge.md",
    )
    serve.add_argument("--transport", choices=("stdio", "http"), default="stdio")
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument(
        "--port", type=int, help="0 picks a free port (default 8765; --sandbox-fusion: 8080)"
    )
    serve.add_argument(
        "--concurrency",
        type=int,
        default=8,
        help="--sandbox-fusion: submissions judged at once (default 8); more wait in a "
        "bounded queue served round-robin per client",
    )
    serve.add_argument(
        "--max-queue",
        type=int,
        default=1024,
        help="--sandbox-fusion: requests allowed to wait (default 1024); beyond it HTTP 504",
    )
    serve.add_argument(
        "--ray",
        metavar="ADDRESS",
        help="--sandbox-fusion: judge on the Ray cluster at ADDRESS ('auto' for the local "
        "one), one judge replica per node, this server in front",
    )
    serve.add_argument(
        "--ray-namespace",
        default="toolservices-judge",
        help="--sandbox-fusion --ray: the namespace of the judge replicas",
    )
    serve.add_argument(
        "--memory-limit-mb",
        type=int,
        default=4096,
        help="--sandbox-fusion: the most memory (RLIMIT_AS) and stack a program gets "
        "(default 4096); a request's memory_limit_MB lowers it",
    )
    serve.add_argument(
        "--image",
        metavar="REF",
        help="--sandbox-fusion: run every submission on this container image's root, with "
        "its toolchains (oci:, oci-archive:, docker-archive:, docker://, dir:; docs/images.md)",
    )
    serve.add_argument(
        "--image-cache",
        metavar="DIR",
        help="--sandbox-fusion --image: the layer cache (default: $TOOLSERVICES_IMAGE_CACHE or "
        "~/.cache/toolservices/images)",
    )
    serve.add_argument(
        "--insecure-registry",
        action="append",
        default=[],
        metavar="HOST:PORT",
        help="--sandbox-fusion --image: a registry reached over plain HTTP (repeatable)",
    )
    serve.add_argument("--path", default="/mcp", help="HTTP endpoint path")
    serve.add_argument("--pool-size", type=int, default=4, help="Python calls running at once")
    serve.add_argument(
        "--timeout",
        type=float,
        default=10.0,
        help="seconds per Python call and, with --shell, per shell command (default 10)",
    )
    serve.add_argument(
        "--max-output",
        type=int,
        default=16 * 1024,
        help="with --shell: bytes of a command's output a client reads (default 16384; head "
        "and tail kept around '[... N bytes omitted ...]')",
    )
    serve.add_argument(
        "--max-sessions",
        type=int,
        default=64,
        help="Python sessions open at once, over all clients (default 64); beyond it a call "
        "that would open one is refused with a message to the model",
    )
    serve.add_argument(
        "--session-idle-timeout",
        type=float,
        default=1800.0,
        help="seconds after which an unused Python session (and an idle HTTP MCP session) "
        "is closed (default 1800; 0 = never)",
    )
    serve.add_argument(
        "--max-request-bytes",
        type=int,
        default=4 * 1024 * 1024,
        help="largest HTTP request body (default 4194304); larger ones get HTTP 413 with a "
        "JSON-RPC error saying so",
    )
    serve.add_argument(
        "--shutdown-grace",
        type=float,
        default=5.0,
        help="on SIGINT/SIGTERM, seconds calls in flight may still finish before they are "
        "cancelled (default 5)",
    )
    serve.add_argument(
        "--session-scope",
        choices=("connection", "namespace"),
        default="connection",
        help="whom a Python session belongs to (HTTP): the MCP connection (default; freed "
        "on disconnect) or the namespace of the caller's bearer token (shared by every "
        "connection with that token, freed on idle timeout); see docs/mcp.md",
    )
    serve.add_argument(
        "--token",
        action="append",
        default=[],
        help="a bearer token HTTP clients must send (repeatable; visible to other local "
        "users in the process list: prefer --tokens-file or $TOOLSERVICES_MCP_TOKENS)",
    )
    serve.add_argument("--tokens-file", help="file of bearer tokens, one a line (# comments)")
    serve.add_argument(
        "--shell",
        action="store_true",
        help="also serve the shell tools (bash, read_file, write_file, str_replace) in "
        "sandboxed shell sessions, scoped and limited like the Python sessions",
    )
    serve.add_argument(
        "--shell-python",
        action="store_true",
        help="with --shell: python_execute runs in the caller's shell session, beside bash "
        "(the same files, /tmp and network; shell_close_session closes both)",
    )
    from toolservices.cli._image import add_image_parser

    add_image_parser(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = _build_parser().parse_args(argv)
    if args.command == "demo":
        from toolservices.cli.demo import run_demo

        if args.repeats < 1:
            print("--repeats must be at least 1", file=sys.stderr)
            return 2
        if args.server is None:
            if args.model or args.parser or args.api_key:
                print("--model, --parser and --api-key need --server", file=sys.stderr)
                return 2
            return run_demo(repeats=args.repeats, out=sys.stdout)
        if not args.model:
            print("--server needs --model", file=sys.stderr)
            return 2
        from toolservices.cli._demo_server import run_server_demo

        return run_server_demo(
            server=args.server,
            model=args.model,
            parser=args.parser,
            api_key=args.api_key,
            repeats=args.repeats,
            out=sys.stdout,
        )
    if args.command == "sandbox-check":
        from toolservices.python import isolation_report
        from toolservices.python.sandbox import format_isolation_report

        report = isolation_report()
        print(json.dumps(report, indent=2) if args.json else format_isolation_report(report))
        if not args.self_test:
            return 0
        from toolservices.python import format_self_test, self_test

        result = self_test()
        print(json.dumps(result, indent=2) if args.json else "\n" + format_self_test(result))
        return 0 if result["ok"] else 1
    if args.command == "serve" and args.sandbox_fusion:
        from toolservices.judge import serve_judge

        return serve_judge(
            host=args.host,
            port=8080 if args.port is None else args.port,
            concurrency=args.concurrency,
            max_queue=args.max_queue,
            memory_limit_mb=args.memory_limit_mb,
            ray=args.ray,
            ray_namespace=args.ray_namespace,
            image=args.image,
            image_cache=args.image_cache,
            insecure_registries=tuple(args.insecure_registry),
        )
    if args.command == "serve":
        from toolservices.mcp import serve_main

        return serve_main(
            transport=args.transport,
            host=args.host,
            port=8765 if args.port is None else args.port,
            path=args.path,
            pool_size=args.pool_size,
            timeout=args.timeout,
            max_sessions=args.max_sessions,
            session_idle_timeout=args.session_idle_timeout or None,
            max_request_bytes=args.max_request_bytes,
            shutdown_grace=args.shutdown_grace,
            session_scope=args.session_scope,
            tokens=args.token,
            tokens_file=args.tokens_file,
            shell=args.shell,
            shell_python=args.shell_python,
            max_output=args.max_output,
        )
    if args.command == "image":
        from toolservices.cli._image import run_image

        return run_image(args)
    raise AssertionError(f"unhandled command {args.command}")


if __name__ == "__main__":
    sys.exit(main())
