"""Bearer tokens for ``serve --mcp`` over HTTP, and the namespaces they prove.

The operator configures tokens (``--token``, ``--tokens-file``,
``$TOOLSERVICES_MCP_TOKENS``); a request presents one as
``Authorization: Bearer <token>`` (or, for clients that can only be given a
URL, the ``access_token`` query parameter of RFC 6750). A valid token names
a namespace by its digest, never by the token itself: the token is kept only
as a SHA-256 digest, compared in constant time, and never logged. A client
may further pick a sub-namespace (``Toolservices-Namespace`` header or the
``namespace`` query parameter) inside its token's namespace, e.g. one per
rollout; it cannot reach any other token's namespace.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from urllib.parse import parse_qs

from toolservices.errors import UserError

__all__ = ["TOKENS_ENV", "AuthFailure", "Tokens", "header_value", "load_tokens"]

#: Environment variable with tokens (separated by whitespace or commas).
TOKENS_ENV = "TOOLSERVICES_MCP_TOKENS"
#: Shortest token accepted from the operator (a guessable token proves nothing).
MIN_TOKEN_LENGTH = 16
#: What a sub-namespace may look like (it becomes part of an executor session id).
_SUB_NAMESPACE = re.compile(r"[A-Za-z0-9._:-]{1,128}")
_SUB_HEADER = b"toolservices-namespace"


class AuthFailure(Exception):
    """A request the server refuses: ``status`` and a message saying what to send instead."""

    def __init__(self, status: int, message: str, *, challenge: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.challenge = challenge


class Tokens:
    """The configured tokens, as digests (see the module docstring)."""

    def __init__(self, tokens: Iterable[str]) -> None:
        digests = []
        for token in tokens:
            if len(token) < MIN_TOKEN_LENGTH or any(c.isspace() for c in token):
                raise UserError(
                    f"MCP tokens must be at least {MIN_TOKEN_LENGTH} characters without "
                    "whitespace (e.g. python -c 'import secrets; print(secrets.token_urlsafe())'); "
                    f"one configured token is {len(token)} characters long"
                )
            digests.append(hashlib.sha256(token.encode()).digest())
        if not digests:
            raise UserError(
                "no MCP tokens configured: give --token, --tokens-file or "
                f"${TOKENS_ENV} (or use --session-scope connection)"
            )
        self._digests = digests

    def __len__(self) -> int:
        return len(self._digests)

    def namespace(self, headers: Iterable[tuple[bytes, bytes]], query: bytes) -> str:
        """The namespace a request proves (``<token digest>`` or ``<digest>:<sub>``).

        Raises :class:`AuthFailure` (401 without a valid token, 400 for a bad
        sub-namespace); the message never repeats what was presented.
        """
        fields = parse_qs(query.decode("latin-1"), keep_blank_values=True)
        presented = _bearer(headers)
        if presented is None:
            presented = _first(fields, "access_token")
        if not presented:
            raise AuthFailure(
                401,
                "This server keeps Python sessions per token namespace and needs a bearer "
                "token: send 'Authorization: Bearer <token>' (or the access_token URL "
                "parameter) with a token its operator configured (--token, --tokens-file "
                f"or ${TOKENS_ENV}).",
                challenge='Bearer realm="toolservices"',
            )
        digest = hashlib.sha256(presented.encode("utf-8", "surrogateescape")).digest()
        # Every configured digest is compared (constant time each): no early exit.
        matched = [hmac.compare_digest(digest, known) for known in self._digests]
        if not any(matched):
            raise AuthFailure(
                401,
                "The bearer token is not one this server accepts; ask its operator for a "
                "valid one (tokens are set with --token, --tokens-file or "
                f"${TOKENS_ENV}).",
                challenge='Bearer realm="toolservices", error="invalid_token"',
            )
        namespace = digest.hex()[:32]
        sub = header_value(headers, _SUB_HEADER)
        if sub is None:
            sub = _first(fields, "namespace")
        if sub is None:
            return namespace
        if not _SUB_NAMESPACE.fullmatch(sub):
            raise AuthFailure(
                400,
                "A sub-namespace (Toolservices-Namespace header or namespace URL parameter) "
                "is 1 to 128 characters of letters, digits, '.', '_', ':' and '-'.",
            )
        return f"{namespace}:{sub}"


def header_value(headers: Iterable[tuple[bytes, bytes]], name: bytes) -> str | None:
    """The first ``name`` header (lower case) of ASGI ``headers``, decoded."""
    for key, value in headers:
        if key.lower() == name:
            return bytes(value).decode("latin-1")
    return None


def _first(fields: Mapping[str, list[str]], name: str) -> str | None:
    values = fields.get(name)
    return values[0] if values else None


def _bearer(headers: Iterable[tuple[bytes, bytes]]) -> str | None:
    value = header_value(headers, b"authorization")
    if value is None:
        return None
    scheme, _, credential = value.strip().partition(" ")
    return credential.strip() if scheme.lower() == "bearer" else None


def load_tokens(
    tokens: Iterable[str] = (),
    *,
    tokens_file: str | os.PathLike[str] | None = None,
    environ: Mapping[str, str] | None = None,
) -> list[str]:
    """The tokens of the command line, a tokens file (one a line, ``#`` comments) and
    ``$TOOLSERVICES_MCP_TOKENS``, in that order."""
    found = [t.strip() for t in tokens]
    if tokens_file is not None:
        try:
            text = Path(tokens_file).read_text(encoding="utf-8")
        except OSError as exc:
            raise UserError(f"cannot read the tokens file {tokens_file}: {exc}") from exc
        for line in text.splitlines():
            line = line.strip()
            if line and not line.startswith("#"):
                found.append(line)
    env = os.environ if environ is None else environ
    found += [t for t in re.split(r"[\s,]+", env.get(TOKENS_ENV, "")) if t]
    return found
