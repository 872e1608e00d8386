"""Image references with the transport names of skopeo and podman."""

from __future__ import annotations

import re
from dataclasses import dataclass

from ..errors import UserError

__all__ = ["TRANSPORTS", "ImageRef", "parse_ref"]

TRANSPORTS = ("dir", "oci", "oci-archive", "docker-archive", "docker")

_DIGEST = re.compile(r"^sha256:[0-9a-f]{64}$")
_TAG = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$")
_NAME = re.compile(
    r"^[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*(?:/[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*)*$"
)
# Docker Hub's names when a reference names no registry host.
_HUB = "registry-1.docker.io"


@dataclass(frozen=True)
class ImageRef:
    """One parsed reference.

    ``path`` is the local path (``dir``, ``oci``, ``oci-archive``,
    ``docker-archive``); ``host`` and ``name`` the registry and repository
    (``docker``); ``tag`` or ``digest`` select the image where the transport
    holds several.
    """

    transport: str
    path: str = ""
    host: str = ""
    name: str = ""
    tag: str | None = None
    digest: str | None = None

    def __str__(self) -> str:
        if self.transport == "docker":
            at = f"@{self.digest}" if self.digest else f":{self.tag}"
            return f"docker://{self.host}/{self.name}{at}"
        tail = f":{self.tag}" if self.tag else ""
        return f"{self.transport}:{self.path}{tail}"


def parse_ref(text: str) -> ImageRef:
    """Parse ``TRANSPORT:REST``; a ``UserError`` names the valid forms."""
    transport, sep, rest = text.partition(":")
    if transport == "docker" and rest.startswith("//"):
        return _parse_docker(text, rest[2:])
    if not sep or transport not in TRANSPORTS or transport == "docker" or not rest:
        raise UserError(
            f"image reference {text!r} is not understood; use one of dir:PATH, oci:PATH[:TAG], "
            "oci-archive:PATH[:TAG], docker-archive:PATH, docker://HOST/NAME:TAG or "
            "docker://HOST/NAME@sha256:DIGEST"
        )
    if transport in ("dir", "docker-archive"):
        return ImageRef(transport=transport, path=rest)
    # As skopeo does: the path ends at the first colon, the rest is the tag.
    path, _, tag = rest.partition(":")
    if not path or (tag and not _TAG.match(tag)):
        raise UserError(f"image reference {text!r}: expected {transport}:PATH[:TAG]")
    return ImageRef(transport=transport, path=path, tag=tag or None)


def _parse_docker(text: str, rest: str) -> ImageRef:
    digest: str | None = None
    tag: str | None = None
    if "@" in rest:
        rest, _, digest = rest.partition("@")
        if not _DIGEST.match(digest):
            raise UserError(f"image reference {text!r}: a digest is sha256: and 64 hex digits")
    else:
        head, colon, maybe_tag = rest.rpartition(":")
        if colon and "/" not in maybe_tag:
            rest, tag = head, maybe_tag
            if not _TAG.match(tag):
                raise UserError(f"image reference {text!r}: {tag!r} is not a valid tag")
        else:
            tag = "latest"
    first, slash, remainder = rest.partition("/")
    if slash and ("." in first or ":" in first or first == "localhost"):
        host, name = first, remainder
    else:
        host, name = _HUB, rest
        if "/" not in name:
            name = f"library/{name}"
    if not _NAME.match(name):
        raise UserError(f"image reference {text!r}: {name!r} is not a valid repository name")
    return ImageRef(transport="docker", host=host, name=name, tag=tag, digest=digest)
