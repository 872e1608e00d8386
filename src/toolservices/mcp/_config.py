"""Typed server configurations, and the contract's dict forms coerced into them."""

from __future__ import annotations

import functools
import importlib.metadata
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeAlias

from toolservices.errors import UserError

__all__ = [
    "IMPLEMENTATION_NAME",
    "HttpServer",
    "ServerConfig",
    "StdioServer",
    "coerce_server",
    "coerce_servers",
    "library_version",
]

#: How our client and server introduce themselves (``clientInfo`` / ``serverInfo``).
IMPLEMENTATION_NAME = "toolservices"


@functools.cache
def library_version() -> str:
    """The installed toolservices version (``__version__`` when run from a source tree)."""
    try:
        return importlib.metadata.version("toolservices")
    except importlib.metadata.PackageNotFoundError:
        from toolservices import __version__

        return __version__


#: Variables a stdio server inherits besides what its config passes explicitly
#: (the SDK adds its own short allowlist: HOME, LOGNAME, PATH, SHELL, TERM, USER).
#: Locale variables keep text decoding identical to the parent's; nothing else
#: leaks, so API keys in the trainer's environment stay out of tool servers.
ENV_ALLOWLIST = ("HOME", "PATH", "LANG", "LC_ALL", "LC_CTYPE", "TMPDIR")


@dataclass(frozen=True, kw_only=True)
class StdioServer:
    """A server run as a child process speaking MCP over stdin/stdout.

    The child gets only ``env`` plus :data:`ENV_ALLOWLIST`; it runs in its
    own session (process group) so shutdown reaches its descendants too.
    """

    command: str
    args: Sequence[str] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    cwd: str | None = None

    def child_env(self) -> dict[str, str]:
        """The complete environment the child process receives."""
        base = {k: os.environ[k] for k in ENV_ALLOWLIST if k in os.environ}
        return {**base, **self.env}


@dataclass(frozen=True, kw_only=True)
class HttpServer:
    """A server reached over MCP's streamable HTTP transport."""

    url: str
    headers: Mapping[str, str] = field(default_factory=dict)


ServerConfig: TypeAlias = StdioServer | HttpServer

_STDIO_KEYS = {"command", "args", "env", "cwd"}
_HTTP_KEYS = {"url", "headers"}


def coerce_server(name: str, config: ServerConfig | Mapping[str, Any]) -> ServerConfig:
    """A typed config from a typed one or from the contract's dict forms."""
    if isinstance(config, (StdioServer, HttpServer)):
        return config
    if not isinstance(config, Mapping):
        raise UserError(
            f"MCP server '{name}': expected StdioServer, HttpServer or a dict, "
            f"got {type(config).__name__}"
        )
    keys = set(config)
    if "command" in keys and "url" in keys:
        raise UserError(f"MCP server '{name}': give either 'command' (stdio) or 'url' (HTTP)")
    if "command" in keys:
        _check_keys(name, keys, _STDIO_KEYS)
        args = config.get("args") or ()
        if isinstance(args, str) or not all(isinstance(a, str) for a in args):
            raise UserError(f"MCP server '{name}': 'args' must be a list of strings")
        return StdioServer(
            command=str(config["command"]),
            args=tuple(args),
            env=dict(config.get("env") or {}),
            cwd=config.get("cwd"),
        )
    if "url" in keys:
        _check_keys(name, keys, _HTTP_KEYS)
        return HttpServer(url=str(config["url"]), headers=dict(config.get("headers") or {}))
    raise UserError(
        f"MCP server '{name}': a dict config needs 'command' (with optional 'args', 'env') "
        "for stdio or 'url' (with optional 'headers') for streamable HTTP"
    )


def coerce_servers(
    servers: Mapping[str, ServerConfig | Mapping[str, Any]],
) -> dict[str, ServerConfig]:
    """Validate every server config at once, naming the faulty servers."""
    if not isinstance(servers, Mapping) or not servers:
        raise UserError("MCPToolset needs a non-empty mapping of server name -> config")
    out: dict[str, ServerConfig] = {}
    for name, config in servers.items():
        if not isinstance(name, str) or not name or "." in name:
            raise UserError(
                f"MCP server name {name!r} is invalid: use a non-empty string without '.' "
                "(tools are named 'server.tool')"
            )
        out[name] = coerce_server(name, config)
    return out


def _check_keys(name: str, keys: set[str], allowed: set[str]) -> None:
    unknown = keys - allowed
    if unknown:
        raise UserError(
            f"MCP server '{name}': unknown config keys {sorted(unknown)}; "
            f"valid keys are {sorted(allowed)}"
        )
