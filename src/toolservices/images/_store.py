"""The content-addressed layer cache and pulling into it.

Layout under the cache root (``ImageStore.root``)::

    layers/<diff_id hex>/        one unpacked layer, shared read-only by every image and session
    layers/<diff_id hex>.json    its size in bytes
    images/<digest hex>.json     one image: its names, layers (bottom first), Env, WorkingDir
    tmp/                         layers being unpacked; moved into layers/ only when all verified
    lock                         flock held while the cache changes

A pull stages every missing layer, verifies each blob's digest and its
uncompressed ``diff_id``, and only then moves them in and writes the image
record: a failed pull leaves the cache as it was.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import stat
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from ._errors import ImageError, ImageNotFoundError
from ._ref import ImageRef, parse_ref
from ._registry import open_registry
from ._sources import Resolved, open_local
from ._unpack import DigestReader, decompressed, remove_tree_at, unpack_layer

__all__ = ["DEFAULT_MAX_BYTES", "Image", "ImageStore", "default_cache_dir"]

DEFAULT_MAX_BYTES = 50 << 30
_DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def default_cache_dir() -> str:
    """``$TOOLSERVICES_IMAGE_CACHE``, else ``$XDG_CACHE_HOME/toolservices/images``."""
    if os.environ.get("TOOLSERVICES_IMAGE_CACHE"):
        return os.environ["TOOLSERVICES_IMAGE_CACHE"]
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "toolservices", "images")


@dataclass(frozen=True)
class Image:
    """An image ready to be a session's root.

    ``layers`` are directories, bottom first (overlayfs wants them top first
    in ``lowerdir``: :attr:`lowerdirs`). ``digest`` names the image (the
    manifest's digest; ``dir:PATH`` for an unpacked root).
    """

    reference: str
    digest: str
    layers: tuple[str, ...]
    env: tuple[str, ...]
    working_dir: str
    size: int

    @property
    def lowerdirs(self) -> tuple[str, ...]:
        return tuple(reversed(self.layers))

    @property
    def path(self) -> str:
        """``PATH`` from the image's Env (the usual default when it sets none)."""
        for item in self.env:
            if item.startswith("PATH="):
                return item[5:]
        return _DEFAULT_PATH

    def environment(self) -> dict[str, str]:
        """The image's Env as a mapping (malformed names left out), ``PATH`` always set."""
        env: dict[str, str] = {}
        for item in self.env:
            name, sep, value = item.partition("=")
            if sep and name.replace("_", "a").isalnum() and not name[0].isdigit():
                env[name] = value
        env.setdefault("PATH", self.path)
        return env

    def which(self, name: str) -> str | None:
        """Where ``name`` is on the image's ``PATH`` (a path in its root), or None: the first
        directory some layer lays it in (a file or a link to one)."""
        for directory in self.path.split(":"):
            if directory.startswith("/"):
                path = os.path.join(directory, name)
                if any(os.path.lexists(layer + path) for layer in self.layers):
                    return path
        return None


class ImageStore:
    """A layer cache on disk, shared by every session and process of the user.

    ``max_bytes`` bounds the unpacked bytes it holds; a pull that would pass
    it fails (``toolservices image prune`` or ``rm`` make room).
    """

    def __init__(self, root: str | None = None, *, max_bytes: int = DEFAULT_MAX_BYTES) -> None:
        if max_bytes <= 0:
            from ..errors import UserError

            raise UserError(f"max_bytes must be positive, got {max_bytes}")
        self.root = os.path.abspath(root or default_cache_dir())
        self.max_bytes = max_bytes

    # -- paths and locking ------------------------------------------------------------

    def _path(self, *parts: str) -> str:
        return os.path.join(self.root, *parts)

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        for sub in ("layers", "images", "tmp"):
            os.makedirs(self._path(sub), exist_ok=True)
        fd = os.open(self._path("lock"), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)

    def _layer_dir(self, diff_id: str) -> str:
        return self._path("layers", diff_id.partition(":")[2])

    def _layer_size(self, hexd: str) -> int:
        try:
            with open(self._path("layers", hexd + ".json"), "rb") as f:
                return int(json.load(f)["size"])
        except (OSError, ValueError, KeyError, TypeError):
            return 0

    def used_bytes(self) -> int:
        """Bytes of all unpacked layers in the cache."""
        try:
            names = os.listdir(self._path("layers"))
        except FileNotFoundError:
            return 0
        return sum(self._layer_size(n[:-5]) for n in names if n.endswith(".json"))

    # -- pulling ----------------------------------------------------------------------

    def pull(
        self,
        reference: str,
        *,
        insecure_registries: Sequence[str] = (),
        auth_file: str | None = None,
    ) -> Image:
        """Make ``reference`` ready: unpack what the cache lacks, verify every blob."""
        ref = parse_ref(reference)
        if ref.transport == "dir":
            return _dir_image(ref)
        opened = (
            open_registry(ref, insecure_registries=insecure_registries, auth_file=auth_file)
            if ref.transport == "docker"
            else open_local(ref)
        )
        with opened as resolved:
            return self._store(ref, resolved)

    def _store(self, ref: ImageRef, resolved: Resolved) -> Image:
        missing = [
            layer for layer in resolved.layers if not os.path.isdir(self._layer_dir(layer.diff_id))
        ]
        known = sum(layer.size or 0 for layer in missing)
        if known > self.max_bytes:
            raise ImageError(
                f"{ref}: its layers alone are {known >> 20} MiB compressed, more than the image "
                f"cache's budget of {self.max_bytes >> 20} MiB (ImageStore(max_bytes=...))"
            )
        os.makedirs(self._path("tmp"), exist_ok=True)
        staging = tempfile.mkdtemp(prefix="pull-", dir=self._path("tmp"))
        # Held while staging: prune leaves a staging directory alone while it is locked.
        staging_fd = os.open(staging, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        fcntl.flock(staging_fd, fcntl.LOCK_EX)
        try:
            used = self.used_bytes()
            staged: dict[str, tuple[str, int]] = {}
            for index, layer in enumerate(missing):
                if layer.diff_id in staged:
                    continue
                dest = os.path.join(staging, str(index))
                os.mkdir(dest, 0o755)
                size = self._unpack(ref, layer, dest, used + sum(s for _, s in staged.values()))
                staged[layer.diff_id] = (dest, size)
            with self._locked():
                if used + sum(s for _, s in staged.values()) > self.max_bytes:
                    raise ImageError(f"{ref}: the image cache is over its budget; prune it")
                for diff_id, (dest, size) in staged.items():
                    target = self._layer_dir(diff_id)
                    if os.path.isdir(target):
                        continue  # another pull put it there meanwhile
                    _write_json(target + ".json", {"size": size})
                    os.rename(dest, target)
                return self._record(ref, resolved)
        finally:
            remove_tree(staging)
            os.close(staging_fd)

    def _unpack(self, ref: ImageRef, layer: Any, dest: str, used: int) -> int:
        what = f"{ref}: layer {layer.digest or layer.diff_id}"

        def budget(laid: int) -> None:
            if used + laid > self.max_bytes:
                raise ImageError(
                    f"{ref}: the image does not fit in the image cache's budget of "
                    f"{self.max_bytes >> 20} MiB ({(used + laid) >> 20} MiB needed so far); "
                    "run `toolservices image prune` / `rm`, or raise ImageStore(max_bytes=...)"
                )

        with layer.open() as raw:
            outer = DigestReader(raw, layer.digest or layer.diff_id, what, layer.size)
            inner = DigestReader(decompressed(outer), layer.diff_id, f"{what} (uncompressed)")
            try:
                size = unpack_layer(inner, dest, what=what, budget=budget)  # type: ignore[arg-type]
            except ImageError as exc:
                if "budget" not in str(exc):
                    # A blob that does not match its digest explains a broken tar best.
                    outer.drain_and_verify()
                raise
            inner.drain_and_verify()
            outer.drain_and_verify()
        return size

    def _record(self, ref: ImageRef, resolved: Resolved) -> Image:
        config = resolved.config.get("config") or {}
        path = self._path("images", resolved.digest.partition(":")[2] + ".json")
        names: list[str] = []
        with contextlib.suppress(OSError, ValueError), open(path, "rb") as f:
            names = list(json.load(f).get("names") or [])
        if str(ref) not in names:
            names.append(str(ref))
        layers = [layer.diff_id for layer in resolved.layers]
        record = {
            "digest": resolved.digest,
            "config_digest": resolved.config_digest,
            "names": names,
            "layers": layers,
            "env": [str(e) for e in config.get("Env") or []],
            "working_dir": str(config.get("WorkingDir") or "/"),
            "size": sum(self._layer_size(d.partition(":")[2]) for d in dict.fromkeys(layers)),
            "pulled": time.time(),
        }
        _write_json(path, record)
        return self._image(str(ref), record)

    def _image(self, reference: str, record: dict[str, Any]) -> Image:
        return Image(
            reference=reference,
            digest=str(record["digest"]),
            layers=tuple(self._layer_dir(d) for d in record["layers"]),
            env=tuple(record["env"]),
            working_dir=str(record["working_dir"]),
            size=int(record["size"]),
        )

    # -- listing and removing -----------------------------------------------------------

    def records(self) -> list[dict[str, Any]]:
        """Every image in the cache (its record: names, digest, layers, size)."""
        out = []
        try:
            names = sorted(os.listdir(self._path("images")))
        except FileNotFoundError:
            return []
        for name in names:
            with (
                contextlib.suppress(OSError, ValueError),
                open(self._path("images", name), "rb") as f,
            ):
                out.append(json.load(f))
        return out

    def list(self) -> list[Image]:
        return [self._image((r["names"] or [r["digest"]])[0], r) for r in self.records()]

    def remove(self, name: str) -> Image:
        """Drop an image (by a name it was pulled as, or its digest) and layers no other uses."""
        with self._locked():
            for record in self.records():
                if name in record["names"] or name == record["digest"]:
                    os.unlink(self._path("images", record["digest"].partition(":")[2] + ".json"))
                    self._prune_locked()
                    return self._image(name, record)
        raise ImageNotFoundError(f"no image {name!r} in the cache at {self.root}")

    def prune(self) -> int:
        """Remove layers no image uses and leftovers of failed pulls; returns bytes freed."""
        with self._locked():
            return self._prune_locked()

    def _prune_locked(self) -> int:
        used = {d.partition(":")[2] for r in self.records() for d in r["layers"]}
        freed = 0
        for name in os.listdir(self._path("layers")):
            hexd = name.removesuffix(".json")
            if hexd in used:
                continue
            freed += self._layer_size(hexd) if name.endswith(".json") else 0
            remove_tree(self._path("layers", name))
        for name in os.listdir(self._path("tmp")):
            if not _busy(self._path("tmp", name)):
                remove_tree(self._path("tmp", name))
        return freed


def _busy(path: str) -> bool:
    """Whether a pull still stages into ``path`` (it holds a lock on it)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


def _dir_image(ref: ImageRef) -> Image:
    path = os.path.realpath(ref.path)
    if not os.path.isdir(path):
        raise ImageNotFoundError(f"{ref}: {ref.path} is not a directory")
    return Image(
        reference=str(ref), digest=f"dir:{path}", layers=(path,), env=(), working_dir="/", size=0
    )


def _write_json(path: str, value: Any) -> None:
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w") as f:
        json.dump(value, f)
    os.replace(tmp, path)


def remove_tree(path: str) -> None:
    """Remove a file or tree, even directories laid without write permission."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if not stat.S_ISDIR(st.st_mode):
        os.unlink(path)
        return
    parent_fd = os.open(os.path.dirname(path) or ".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        remove_tree_at(parent_fd, os.path.basename(path))
    finally:
        os.close(parent_fd)
