"""Network modes: what ``network="none" | "loopback" | "host"`` means for each layer.

The one place that maps a mode to the socket families a session may open
(:func:`allowed_socket_families`, which the seccomp filter follows) and to
whether it needs a network namespace of its own (:func:`effective_mode`).
"""

from __future__ import annotations

import socket

from toolservices.errors import UserError

__all__ = [
    "NETWORK_MODES",
    "allowed_socket_families",
    "effective_mode",
    "family_names",
    "network_mode",
]

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


def allowed_socket_families(mode: str) -> tuple[int, ...]:
    """Socket families a session of this (effective) mode may open; every other fails.

    ``AF_UNIX`` always. ``loopback`` and ``host`` add ``AF_INET``, ``AF_INET6`` and
    ``AF_NETLINK`` (the interface and route queries of resolvers, glibc's address
    checks and ``ip``): under ``loopback`` all of them stay in the session's own
    network namespace, whose only interface is ``lo``. Everything else
    (``AF_VSOCK``, which crosses network namespaces to the hypervisor,
    ``AF_PACKET``, Bluetooth, CAN...) is refused in every mode. The seccomp
    filter and the isolation report both read it.
    """
    if mode in ("loopback", "host"):
        return (socket.AF_UNIX, socket.AF_INET, socket.AF_INET6, _AF_NETLINK)
    return (socket.AF_UNIX,)


def family_names(families: tuple[int, ...]) -> str:
    """``"AF_UNIX, AF_INET"`` for the report."""
    names = {int(f): f.name for f in socket.AddressFamily}
    return ", ".join(names.get(f, str(f)) for f in families)
