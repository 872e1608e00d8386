"""Container images as roots for sessions: references, pulling, a shared layer cache.

References use skopeo's and podman's transport names: ``dir:PATH``,
``oci:PATH[:TAG]``, ``oci-archive:PATH[:TAG]``, ``docker-archive:PATH`` and
``docker://HOST/NAME:TAG`` (or ``@sha256:...``). :class:`ImageStore` unpacks
each layer once into a content-addressed cache and hands out an
:class:`Image` (its layer directories, Env, WorkingDir) that the shell and
Python services stack with overlayfs. See docs/images.md.
"""

from __future__ import annotations

from ._errors import ImageError, ImageNotFoundError, RegistryAuthError
from ._ref import TRANSPORTS, ImageRef, parse_ref
from ._registry import auth_files
from ._store import DEFAULT_MAX_BYTES, Image, ImageStore, default_cache_dir

__all__ = [
    "DEFAULT_MAX_BYTES",
    "TRANSPORTS",
    "Image",
    "ImageError",
    "ImageNotFoundError",
    "ImageRef",
    "ImageStore",
    "RegistryAuthError",
    "apull",
    "auth_files",
    "default_cache_dir",
    "parse_ref",
]


async def apull(store: ImageStore, reference: str, **options: object) -> Image:
    """:meth:`ImageStore.pull` in a worker thread (it reads files and sockets)."""
    import functools

    import anyio

    return await anyio.to_thread.run_sync(functools.partial(store.pull, reference, **options))  # type: ignore[arg-type]
