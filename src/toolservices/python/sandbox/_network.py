"""Network modes: what ``network="none" | "loopback" | "host"`` means for each layer.

The one place that maps a mode to the socket families a session may open
(:func:`allowed_socket_families`, which the seccomp filter follows) and to
whether it needs a network namespace of its own (:func:`effective_mode`).
"""

from __future__ import annotations

import socket

from toolservices.errors import UserError

__all__ = ["NETWORK_MODES", "allowed_socket_families", "effective_mode", "network_mode"]

NETWORK_MODES = ("none", "loopback", "host")

_AF_NETLINK = getattr(socket, "AF_NETLINK", 16)


def network_mode(value: object) -> str:
    """The mode named by ``value``: one of :data:`NETWORK_MODES`, or a bool (True: host)."""
    if value is True:
        return "host"
    if value is False:
        return "none"
    if isinstance(value, str) and value in NETWORK_MODES:
        return value
    raise UserError(
        f"network must be one of {', '.join(repr(m) for m in NETWORK_MODES)} "
        f"(or True/False for 'host'/'none'), got {value!r}"
    )


def effective_mode(mode: object, *, session_ns: bool) -> str:
    """``loopback`` needs each session's own network namespace; without one it is ``none``
    (the host's loopback would otherwise be reachable)."""
    name = network_mode(mode)
    return "none" if name == "loopback" and not session_ns else name


def allowed_socket_families(mode: str) -> frozenset[int] | None:
    """Socket families a session of this (effective) mode may open; None: every family.

    ``none``: ``AF_UNIX`` only. ``loopback``: also inet/inet6 (and route netlink, for
    ``ip addr`` and glibc's address checks), all confined to the session's own network
    namespace whose only interface is ``lo``. ``host``: no restriction.
    """
    if mode == "host":
        return None
    if mode == "loopback":
        return frozenset({socket.AF_UNIX, socket.AF_INET, socket.AF_INET6, _AF_NETLINK})
    return frozenset({socket.AF_UNIX})
