"""Pull from a registry: the OCI distribution API over HTTP(S), standard library only.

Anonymous access, Basic auth and the bearer-token dance (``WWW-Authenticate:
Bearer realm=...``); credentials come from the files podman and docker write.
Plain HTTP only for hosts the caller lists in ``insecure_registries``.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import re
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from typing import IO, Any

from ._errors import ImageError, ImageNotFoundError, RegistryAuthError
from ._ref import ImageRef
from ._sources import (
    INDEX_TYPES,
    MANIFEST_TYPES,
    Resolved,
    resolve,
)

__all__ = ["auth_files", "credentials_for", "open_registry"]

_TIMEOUT = 30.0
_MAX_MANIFEST = 4 << 20
_PARAM = re.compile(r'(\w+)="([^"]*)"')


def auth_files() -> list[str]:
    """The credential files read, in order (the first that names the host wins)."""
    files = []
    if os.environ.get("REGISTRY_AUTH_FILE"):
        files.append(os.environ["REGISTRY_AUTH_FILE"])
    if os.environ.get("XDG_RUNTIME_DIR"):
        files.append(os.path.join(os.environ["XDG_RUNTIME_DIR"], "containers", "auth.json"))
    home = os.path.expanduser("~")
    files.append(os.path.join(home, ".config", "containers", "auth.json"))
    docker_config = os.environ.get("DOCKER_CONFIG", os.path.join(home, ".docker"))
    files.append(os.path.join(docker_config, "config.json"))
    return files


def credentials_for(host: str, files: Sequence[str]) -> tuple[str, str] | None:
    """``(user, password)`` for ``host`` from the first auth file that has it."""
    for path in files:
        try:
            with open(path, "rb") as f:
                auths = json.load(f).get("auths") or {}
        except (OSError, ValueError, AttributeError):
            continue
        for key, entry in auths.items():
            name = urllib.parse.urlsplit(key).netloc if "://" in key else key.split("/")[0]
            if name == host and isinstance(entry, dict) and entry.get("auth"):
                try:
                    user, _, password = base64.b64decode(entry["auth"]).decode().partition(":")
                except (ValueError, UnicodeDecodeError):
                    continue
                return user, password
    return None


class _Client:
    def __init__(self, ref: ImageRef, insecure: bool, files: Sequence[str]) -> None:
        self.ref = ref
        self.base = f"{'http' if insecure else 'https'}://{ref.host}/v2/{ref.name}"
        self._creds = credentials_for(ref.host, files)
        self._auth: str | None = None
        handlers: list[Any] = []
        if ref.host.split(":")[0] in ("127.0.0.1", "localhost", "[::1]"):
            handlers.append(urllib.request.ProxyHandler({}))
        self._opener = urllib.request.build_opener(*handlers)

    def _send(self, url: str, accept: str, authorized: bool = True) -> Any:
        request = urllib.request.Request(url, headers={"Accept": accept})
        if authorized and self._auth:
            # Not carried over a redirect to blob storage elsewhere.
            request.add_unredirected_header("Authorization", self._auth)
        try:
            return self._opener.open(request, timeout=_TIMEOUT)
        except urllib.error.HTTPError as exc:
            return exc
        except (urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            raise ImageError(
                f"{self.ref}: could not reach the registry {self.ref.host} ({reason})",
                retryable=True,
            ) from None

    def get(self, path: str, accept: str = "*/*") -> Any:
        """GET with auth as the registry asks for it; an error for each refusal."""
        url = f"{self.base}/{path}"
        response = self._send(url, accept)
        if response.status == 401 and self._auth is None:
            challenge = response.headers.get("WWW-Authenticate", "")
            response.close()
            self._authenticate(challenge)
            response = self._send(url, accept)
        if response.status == 401:
            response.close()
            raise RegistryAuthError(
                f"{self.ref}: the registry {self.ref.host} refused the credentials"
                + (
                    " (wrong user name or password?)"
                    if self._creds
                    else "; it needs a login and none was found in " + ", ".join(auth_files())
                )
            )
        if response.status == 404:
            response.close()
            raise ImageNotFoundError(f"{self.ref}: not found at {self.ref.host} ({path})")
        if response.status >= 400:
            body = response.read(512).decode(errors="replace")
            response.close()
            raise ImageError(
                f"{self.ref}: the registry answered HTTP {response.status} for {path}: {body}",
                retryable=response.status >= 500 or response.status == 429,
            )
        return response

    def _authenticate(self, challenge: str) -> None:
        scheme, _, params_text = challenge.partition(" ")
        params = dict(_PARAM.findall(params_text))
        basic = None
        if self._creds is not None:
            basic = "Basic " + base64.b64encode(":".join(self._creds).encode()).decode()
        if scheme.lower() == "basic":
            if basic is None:
                raise RegistryAuthError(
                    f"{self.ref}: the registry {self.ref.host} needs a login; none was found in "
                    + ", ".join(auth_files())
                )
            self._auth = basic
            return
        if scheme.lower() != "bearer" or "realm" not in params:
            raise RegistryAuthError(f"{self.ref}: unsupported auth challenge {challenge!r}")
        query = {
            "service": params.get("service", ""),
            "scope": params.get("scope", f"repository:{self.ref.name}:pull"),
        }
        url = params["realm"] + "?" + urllib.parse.urlencode({k: v for k, v in query.items() if v})
        request = urllib.request.Request(url)
        if basic is not None:
            request.add_unredirected_header("Authorization", basic)
        try:
            with self._opener.open(request, timeout=_TIMEOUT) as response:
                token = json.loads(response.read(1 << 20))
        except urllib.error.HTTPError as exc:
            exc.close()
            if exc.code in (401, 403):
                raise RegistryAuthError(
                    f"{self.ref}: the token service refused the credentials for {self.ref.host}"
                ) from None
            raise ImageError(
                f"{self.ref}: token service answered HTTP {exc.code}", retryable=exc.code >= 500
            ) from None
        except (urllib.error.URLError, OSError, ValueError) as exc:
            raise ImageError(
                f"{self.ref}: could not get a token from {url} ({exc})", retryable=True
            ) from None
        value = token.get("token") or token.get("access_token")
        if not value:
            raise RegistryAuthError(f"{self.ref}: the token service sent no token")
        self._auth = f"Bearer {value}"

    def manifest(self, reference: str) -> tuple[bytes, str]:
        accept = ", ".join(MANIFEST_TYPES + INDEX_TYPES)
        with self.get(f"manifests/{reference}", accept) as response:
            data = response.read(_MAX_MANIFEST + 1)
            media = response.headers.get("Content-Type", "")
        if len(data) > _MAX_MANIFEST:
            raise ImageError(f"{self.ref}: manifest larger than {_MAX_MANIFEST} bytes")
        return data, media

    def blob(self, digest: str) -> Callable[[], contextlib.AbstractContextManager[IO[bytes]]]:
        @contextlib.contextmanager
        def opener() -> Iterator[IO[bytes]]:
            with self.get(f"blobs/{digest}") as response:
                yield response

        return opener


@contextlib.contextmanager
def open_registry(
    ref: ImageRef, *, insecure_registries: Sequence[str], auth_file: str | None
) -> Iterator[Resolved]:
    """Resolve a ``docker://`` reference; blobs stream on demand."""
    files = [auth_file] if auth_file else auth_files()
    client = _Client(ref, ref.host in insecure_registries, files)

    def config(digest: str) -> bytes:
        with client.blob(digest)() as response:
            return bytes(response.read(_MAX_MANIFEST + 1))

    def manifest(reference: str) -> bytes:
        return client.manifest(reference)[0]

    yield resolve(str(ref), ref.digest or ref.tag or "latest", manifest, config, client.blob)
