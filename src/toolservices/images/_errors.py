"""The images package's errors, in the library's three families."""

from __future__ import annotations

from ..errors import InfrastructureError, UserError

__all__ = ["ImageError", "ImageNotFoundError", "RegistryAuthError"]


class ImageError(InfrastructureError):
    """An image could not be read, verified, unpacked or stored; nothing was kept.

    ``retryable`` is True only where the same pull may succeed later (a
    registry that could not be reached).
    """


class ImageNotFoundError(ImageError, UserError):
    """The reference names no image: a missing path, tag or repository."""


class RegistryAuthError(ImageError):
    """The registry refused the credentials (or asked for some and none were found)."""
