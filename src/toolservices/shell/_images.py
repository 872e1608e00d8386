"""Several images per ShellService: which image each session stands on.

The service's image (``ShellService(image=...)``) is in its launch state: every
session made on first use, and every spare interpreter, stands on it.
``start_session(session_id, image=other)`` makes a session on another image:
the image is pulled into the service's cache on first use (once: concurrent
starts of one reference wait for the same pull), and its layer list and
environment travel in the request that makes the session (the fork server's
SPAWN, ``root``), never in the launch state. Copies made by ``fork_session``
stand on their source's image.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import threading
from collections.abc import Collection
from typing import Any

import anyio.to_thread

from toolservices.errors import UserError
from toolservices.images import Image, ImageStore
from toolservices.python.host import SpawnRoot
from toolservices.python.sandbox import SandboxConfig
from toolservices.shell._requests import warmup_code

__all__ = ["SessionImages", "check_bash", "check_image_spares", "has_bash", "start_dir"]

log = logging.getLogger(__name__)


def has_bash(image: Image) -> bool:
    """Whether some layer lays ``bin/bash`` or ``usr/bin/bash`` (a file or a link to one)."""
    return any(
        os.path.lexists(os.path.join(layer, name))
        for layer in image.layers
        for name in ("bin/bash", "usr/bin/bash")
    )


def start_dir(image: Image | None) -> str | None:
    """Where a session on ``image`` starts: its ``WorkingDir``; None (the workspace) when
    there is none, or it is ``/`` (docker's default) or relative."""
    if image is None or image.working_dir in ("", "/") or not image.working_dir.startswith("/"):
        return None
    return image.working_dir


def check_image_spares(image_spares: object) -> int:
    """``ShellService(image_spares=...)``: an int >= 0, else a UserError saying so."""
    if isinstance(image_spares, bool) or not isinstance(image_spares, int) or image_spares < 0:
        raise UserError(
            f"image_spares must be an int >= 0 (other images that keep a warm spare), "
            f"got {image_spares!r}"
        )
    return image_spares


def check_bash(image: Image, reference: str) -> Image:
    """``image``, or a UserError when it has no bash (every command runs in the image's)."""
    if not has_bash(image):
        raise UserError(
            f"image {reference!r} has no /bin/bash (or /usr/bin/bash): ShellService runs "
            "every command with the image's bash; use an image that has it"
        )
    return image


class SessionImages:
    """The images of a service's sessions: pulled once per reference, named per session."""

    def __init__(
        self,
        store: ImageStore,
        *,
        default: Image | None,
        insecure_registries: tuple[str, ...],
    ) -> None:
        self.store = store
        self.default = default
        self.insecure_registries = insecure_registries
        self.layers_dir = os.path.join(store.root, "layers")
        self._lock = threading.Lock()
        self._pulled: dict[str, Image] = {}
        self._pulling: dict[str, threading.Lock] = {}
        #: sessions on another image than the service's (copies included)
        self.sessions: dict[str, Image] = {}
        #: their supervisor's configuration (repr), by image digest: its WorkingDir
        self._configs: dict[str, str] = {}

    def with_cache(self, config: SandboxConfig) -> SandboxConfig:
        """``config`` with the cache's layers shown to the fork server, for sessions on other
        images; unchanged where the cache cannot be made (no pull could fill it either)."""
        try:
            os.makedirs(self.layers_dir, 0o755, exist_ok=True)
        except OSError as exc:
            log.debug(
                "no image cache at %s, so no session on another image: %s", self.layers_dir, exc
            )
            return config
        return dataclasses.replace(config, image_caches=(self.layers_dir,))

    def pull(self, reference: str) -> Image | None:
        """The image ``reference`` names, pulled into the cache at its first use; None when
        it is the service's own (its sessions need nothing in the request)."""
        if not isinstance(reference, str) or not reference:
            raise UserError(f"image must be an image reference (a str), got {reference!r}")
        if self.default is not None and reference == self.default.reference:
            return None
        with self._lock:
            image = self._pulled.get(reference)
            if image is not None:
                return image
            gate = self._pulling.setdefault(reference, threading.Lock())
        with gate:  # one pull per reference; the others wait for it and take its result
            with self._lock:
                image = self._pulled.get(reference)
            if image is None:
                image = self.store.pull(reference, insecure_registries=self.insecure_registries)
                if any(os.path.dirname(p) != self.layers_dir for p in image.layers):
                    raise UserError(
                        f"start_session(image={reference!r}): a session on another image than "
                        "the service's stacks layers from the service's image cache; a dir: "
                        "root is not copied there: make it the service's image= instead"
                    )
                image = check_bash(image, reference)
                with self._lock:
                    self._pulled[reference] = image
                    self._pulling.pop(reference, None)
        if self.default is not None and image.digest == self.default.digest:
            return None
        return image

    async def apull(self, reference: str) -> Image | None:
        """:meth:`pull` in a worker thread (a pull is minutes of I/O at worst)."""
        return await anyio.to_thread.run_sync(self.pull, reference)

    def root(self, image: Image) -> SpawnRoot:
        """The root of a session on ``image`` (after :meth:`put`): the SPAWN request's, its
        layers (top first) and its Env over the service's (the service image's names it
        lacks are unset); and what its image's spare runs ahead of need, as the service's
        spares do: load the supervisor, start the first bash, with this image's
        configuration (its WorkingDir)."""
        env: dict[str, str | None] = {}
        if self.default is not None:
            env = dict.fromkeys(self.default.environment())
        env.update(image.environment())
        return SpawnRoot(
            {"layers": list(image.lowerdirs), "env": env},
            warmup=warmup_code(self._configs[image.digest]),
        )

    def put(
        self, session: str, image: Image, config: dict[str, Any], live: Collection[str]
    ) -> None:
        """``session`` stands on ``image``; its supervisor gets ``config`` (its first command
        starts in that image's WorkingDir, also after the session was restarted). ``live``:
        the sessions the executor still knows an image of (it forgets evicted ones after a
        while): the others are forgotten here too, now and then."""
        with self._lock:  # against another thread's put or report
            if len(self.sessions) > 2 * len(live) + 64:
                for gone in [s for s in self.sessions if s not in live]:
                    del self.sessions[gone]
            self.sessions[session] = image
            self._configs.setdefault(image.digest, json.dumps(config))

    def config_json(self, session: str | None) -> str | None:
        """The supervisor configuration of a session on another image; None: the service's."""
        image = self.sessions.get(session) if session is not None else None
        return None if image is None else self._configs[image.digest]

    def copied(self, src: str, copies: list[str]) -> None:
        """``fork_session`` copies stand on their source's image."""
        with self._lock:
            image = self.sessions.get(src)
            if image is not None:
                self.sessions.update(dict.fromkeys(copies, image))

    def report(self) -> dict[str, dict[str, str]]:
        """Each session on another image than the service's: its reference and digest."""
        with self._lock:
            sessions = sorted(self.sessions.items())
        return {
            session: {"reference": image.reference, "digest": image.digest}
            for session, image in sessions
        }
