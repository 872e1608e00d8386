"""Where an image's manifest, config and layer blobs come from (local transports).

Each source resolves a reference to a :class:`Resolved` image: its verified
config and, per layer, how to open the blob and which digests it must have.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import platform
import tarfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import IO, Any

from ._errors import ImageError, ImageNotFoundError
from ._ref import ImageRef

__all__ = ["Layer", "Resolved", "open_local", "pick_platform", "verified"]

INDEX_TYPES = (
    "application/vnd.oci.image.index.v1+json",
    "application/vnd.docker.distribution.manifest.list.v2+json",
)
MANIFEST_TYPES = (
    "application/vnd.oci.image.manifest.v1+json",
    "application/vnd.docker.distribution.manifest.v2+json",
)
_ARCH = {
    "x86_64": "amd64",
    "aarch64": "arm64",
    "armv7l": "arm",
    "ppc64le": "ppc64le",
    "s390x": "s390x",
    "riscv64": "riscv64",
}


@dataclass(frozen=True)
class Layer:
    """One layer: ``digest`` of its blob as stored (None when only ``diff_id`` is known)."""

    diff_id: str
    digest: str | None
    size: int | None
    open: Callable[[], contextlib.AbstractContextManager[IO[bytes]]]


@dataclass
class Resolved:
    """An image ready to unpack: names, verified config and layers."""

    digest: str  # the manifest's (or, without one, the config's) digest
    config_digest: str
    config: dict[str, Any]
    layers: list[Layer] = field(default_factory=list)


def verified(data: bytes, digest: str, what: str) -> bytes:
    """``data`` if its sha256 is ``digest``; else an error naming the blob."""
    got = "sha256:" + hashlib.sha256(data).hexdigest()
    if got != digest:
        raise ImageError(
            f"{what} {digest}: content does not match its digest (got {got}); corrupted"
        )
    return data


def _json(data: bytes, what: str) -> dict[str, Any]:
    try:
        value = json.loads(data)
    except ValueError as exc:
        raise ImageError(f"{what} is not valid JSON: {exc}") from None
    if not isinstance(value, dict):
        raise ImageError(f"{what} is not a JSON object")
    return value


def pick_platform(index: dict[str, Any], what: str) -> dict[str, Any]:
    """The manifest descriptor of an index for this machine (linux, its architecture)."""
    arch = _ARCH.get(platform.machine(), platform.machine())
    manifests = [m for m in index.get("manifests", []) if isinstance(m, dict)]
    for m in manifests:
        plat = m.get("platform") or {}
        if plat.get("os", "linux") == "linux" and plat.get("architecture") == arch:
            return m
    if len(manifests) == 1 and not manifests[0].get("platform"):
        return manifests[0]
    found = sorted(
        {
            f"{(m.get('platform') or {}).get('os')}/{(m.get('platform') or {}).get('architecture')}"
            for m in manifests
        }
    )
    raise ImageNotFoundError(f"{what} has no image for linux/{arch} (it has: {', '.join(found)})")


Opener = Callable[[str], Callable[[], contextlib.AbstractContextManager[IO[bytes]]]]


def layers_of(
    manifest: dict[str, Any],
    config: dict[str, Any],
    what: str,
    opener: Opener,
) -> list[Layer]:
    """Pair a manifest's layer descriptors with the config's diff_ids."""
    descriptors = manifest.get("layers") or []
    diff_ids = (config.get("rootfs") or {}).get("diff_ids") or []
    if len(descriptors) != len(diff_ids):
        raise ImageError(
            f"{what}: the manifest lists {len(descriptors)} layers, the config {len(diff_ids)}"
        )
    return [
        Layer(
            diff_id=str(diff),
            digest=str(d["digest"]),
            size=int(d.get("size", 0)) or None,
            open=opener(str(d["digest"])),
        )
        for d, diff in zip(descriptors, diff_ids, strict=True)
    ]


def resolve(
    what: str,
    reference: str,
    manifest: Callable[[str], bytes],
    config: Callable[[str], bytes],
    opener: Opener,
) -> Resolved:
    """Follow ``reference`` (a manifest's digest, or a registry's tag) through at most one
    index (the per-platform one of a multi-platform image) to the image's manifest and its
    config, each verified against its digest (a tag names nothing to verify against);
    ``manifest`` and ``config`` fetch a blob's bytes, ``opener`` a layer's stream."""
    for _ in range(2):
        data = manifest(reference)
        if reference.startswith("sha256:"):
            verified(data, reference, f"{what}: manifest")
        parsed = _json(data, f"{what}: manifest")
        if parsed.get("mediaType") in INDEX_TYPES or "manifests" in parsed:
            reference = str(pick_platform(parsed, what)["digest"])
            continue
        config_digest = str(parsed["config"]["digest"])
        image_config = _json(
            verified(config(config_digest), config_digest, f"{what}: config"), f"{what}: config"
        )
        return Resolved(
            digest="sha256:" + hashlib.sha256(data).hexdigest(),
            config_digest=config_digest,
            config=image_config,
            layers=layers_of(parsed, image_config, what, opener),
        )
    raise ImageError(f"{what}: indexes nested too deep")


class _Blobs:
    """Blobs of an OCI layout: a directory or an archive of one."""

    def __init__(self, ref: ImageRef) -> None:
        self.ref = ref
        self._tar: tarfile.TarFile | None = None
        path = ref.path
        if not os.path.exists(path):
            raise ImageNotFoundError(f"{ref}: {path} does not exist")
        if ref.transport in ("oci-archive", "docker-archive"):
            try:
                self._tar = tarfile.open(path, mode="r:")  # noqa: SIM115 (closed by close())
            except (tarfile.TarError, OSError) as exc:
                raise ImageError(f"{ref}: not a readable tar archive ({exc})") from None
            try:
                self._members = {m.name.removeprefix("./"): m for m in self._safe_members()}
            except ImageError:
                self._tar.close()
                raise

    def _safe_members(self) -> Iterator[tarfile.TarInfo]:
        assert self._tar is not None
        try:
            yield from self._tar.getmembers()
        except (tarfile.TarError, EOFError, OSError) as exc:
            raise ImageError(f"{self.ref}: the archive is truncated or corrupted ({exc})") from None

    def close(self) -> None:
        if self._tar is not None:
            self._tar.close()

    @contextlib.contextmanager
    def open(self, name: str) -> Iterator[IO[bytes]]:
        if self._tar is None:
            try:
                f = open(os.path.join(self.ref.path, name), "rb")  # noqa: SIM115
            except FileNotFoundError:
                raise ImageError(f"{self.ref}: blob {name} is missing") from None
            with f:
                yield f
            return
        member = self._members.get(name)
        if member is None or not member.isreg():
            raise ImageError(f"{self.ref}: {name} is missing from the archive")
        member_file = self._tar.extractfile(member)
        assert member_file is not None
        with member_file:
            yield member_file

    def read(self, name: str, limit: int = 16 << 20) -> bytes:
        with self.open(name) as f:
            data = f.read(limit + 1)
        if len(data) > limit:
            raise ImageError(f"{self.ref}: {name} is larger than {limit} bytes")
        return data

    def blob(self, digest: str) -> Callable[[], contextlib.AbstractContextManager[IO[bytes]]]:
        return lambda: self.open(_blob_name(digest))


@contextlib.contextmanager
def open_local(ref: ImageRef) -> Iterator[Resolved]:
    """Resolve an ``oci``, ``oci-archive`` or ``docker-archive`` reference."""
    blobs = _Blobs(ref)
    try:
        yield _docker_archive(blobs) if ref.transport == "docker-archive" else _oci(blobs)
    finally:
        blobs.close()


def _oci(blobs: _Blobs) -> Resolved:
    ref = blobs.ref
    try:
        index = _json(blobs.read("index.json"), f"{ref}: index.json")
    except ImageError as exc:
        if "missing" in str(exc):
            raise ImageNotFoundError(f"{ref}: not an OCI image layout (no index.json)") from None
        raise
    descriptors = [m for m in index.get("manifests", []) if isinstance(m, dict)]
    if ref.tag is not None:
        named = [
            m
            for m in descriptors
            if (m.get("annotations") or {}).get("org.opencontainers.image.ref.name") == ref.tag
        ]
        if not named:
            tags = sorted(
                {
                    (m.get("annotations") or {}).get("org.opencontainers.image.ref.name", "")
                    for m in descriptors
                }
                - {""}
            )
            raise ImageNotFoundError(
                f"{ref}: no tag {ref.tag!r} (tags: {', '.join(tags) or 'none'})"
            )
        descriptors = named
    if len(descriptors) != 1:
        raise ImageNotFoundError(
            f"{ref}: the layout holds {len(descriptors)} images; name one with :TAG"
        )

    def read(digest: str) -> bytes:
        return blobs.read(_blob_name(digest))

    return resolve(str(ref), str(descriptors[0]["digest"]), read, read, blobs.blob)


def _blob_name(digest: str) -> str:
    algorithm, _, hexd = digest.partition(":")
    return f"blobs/{algorithm}/{hexd}"


def _docker_archive(blobs: _Blobs) -> Resolved:
    ref = blobs.ref
    try:
        raw = blobs.read("manifest.json")
    except ImageError:
        raise ImageNotFoundError(f"{ref}: not a docker-archive (no manifest.json)") from None
    try:
        entries = json.loads(raw)
    except ValueError as exc:
        raise ImageError(f"{ref}: manifest.json is not valid JSON: {exc}") from None
    if not isinstance(entries, list) or len(entries) != 1 or not isinstance(entries[0], dict):
        raise ImageError(f"{ref}: expected exactly one image in manifest.json")
    entry = entries[0]
    config_bytes = blobs.read(str(entry["Config"]))
    config_digest = "sha256:" + hashlib.sha256(config_bytes).hexdigest()
    config = _json(config_bytes, f"{ref}: config")
    diff_ids = (config.get("rootfs") or {}).get("diff_ids") or []
    paths = [str(p) for p in entry.get("Layers") or []]
    if len(paths) != len(diff_ids):
        raise ImageError(
            f"{ref}: manifest.json lists {len(paths)} layers, the config {len(diff_ids)}"
        )

    def opener(name: str) -> Callable[[], contextlib.AbstractContextManager[IO[bytes]]]:
        return lambda: blobs.open(name)

    layers = [
        Layer(diff_id=str(d), digest=None, size=None, open=opener(p))
        for p, d in zip(paths, diff_ids, strict=True)
    ]
    return Resolved(digest=config_digest, config_digest=config_digest, config=config, layers=layers)
