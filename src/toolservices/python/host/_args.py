"""The checks of ``PythonExecutorService``'s arguments; the image a service runs on, its sandbox."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from toolservices.errors import UserError
from toolservices.python.sandbox import image_config

if TYPE_CHECKING:
    from toolservices.images import Image

__all__ = ["check_session_id", "check_timeout", "image_sandbox", "pull_image"]


def check_timeout(value: object) -> float:
    """A timeout as a float; UserError for anything but a finite number of seconds > 0."""
    number = value if isinstance(value, (int, float)) and not isinstance(value, bool) else None
    if number is not None and math.isfinite(number) and number > 0:
        return float(number)
    raise UserError(
        f"timeout must be a finite number of seconds > 0 (an int or a float), got {value!r}"
    )


def check_session_id(value: object) -> str:
    """Session ids are non-empty strings: 5 and "5" must not silently share a session."""
    if isinstance(value, str) and value:
        return value
    raise UserError(
        f"session_id must be a non-empty str (or None for a fresh interpreter), got {value!r}"
    )


def image_sandbox(config: Any, image: Image) -> Any:
    """``config`` with ``image`` as every session's root, its ``Env`` and its ``python3``."""
    python = image.which("python3")
    if python is None:
        raise UserError(
            f"image {image.reference!r} has no python3 on its PATH ({image.path}): "
            "PythonExecutorService(image=...) runs the image's own Python; use an image that "
            "has one, or ShellService(image=...) for a shell"
        )
    # as ShellService's sessions: the workspace at one path (/workspace), each session its
    # own PID namespace; spawn_with_files then copies a session's writable layer too
    return dataclasses.replace(
        image_config(config, image),
        root_python=python,
        fixed_workspace=True,
        own_pids=True,
    )


def pull_image(
    image: str | None, *, image_cache: str | None, insecure_registries: Iterable[str]
) -> tuple[Image | None, dict[str, Any]]:
    """The image a service's sessions run on (None without one), pulled into ``image_cache``,
    and the arguments that name it to a replica (an image travels by name: a replica pulls
    it into its own node's cache). Both services take these three arguments."""
    registries = tuple(insecure_registries)
    args = {"image": image, "image_cache": image_cache, "insecure_registries": registries}
    if image is None:
        return None, args
    from toolservices.images import ImageStore  # (urllib and tarfile: only for images)

    return ImageStore(image_cache).pull(image, insecure_registries=registries), args
