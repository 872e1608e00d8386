"""Fixtures: test images built from busybox-static, a real registry on 127.0.0.1."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, os.path.dirname(__file__))

from _build import BUSYBOX, busybox_layer, oci_layout  # noqa: E402


def need(tool: str, package: str) -> str:
    path = shutil.which(tool)
    if path is None:
        pytest.skip(f"{tool} is not installed (Debian package {package}; .ci/run installs it)")
    return path


@pytest.fixture(scope="session")
def busybox_oci(tmp_path_factory: pytest.TempPathFactory) -> str:
    """An OCI layout with one gzip busybox layer, tag ``latest``."""
    if not os.path.exists(BUSYBOX):
        pytest.skip(f"{BUSYBOX} is missing (Debian package busybox-static)")
    root = tmp_path_factory.mktemp("busybox") / "oci"
    oci_layout(str(root), [busybox_layer("gzip")])
    return str(root)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="session")
def registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """Debian's docker-registry on 127.0.0.1 (plain HTTP, htpasswd login ``tester``/``s3cret``)."""
    need("docker-registry", "docker-registry")
    htpasswd = need("htpasswd", "apache2-utils")
    root = tmp_path_factory.mktemp("registry")
    subprocess.run(
        [htpasswd, "-Bbc", str(root / "htpasswd"), "tester", "s3cret"],
        check=True,
        capture_output=True,
    )
    auth = f"{{htpasswd: {{realm: test-realm, path: {root}/htpasswd}}}}"
    yield from _serve_registry(root, auth, {})


@pytest.fixture(scope="session")
def token_registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """docker-registry with bearer-token auth, its token service a real JWT issuer here.

    The token service (http.server on 127.0.0.1) checks the Basic login
    ``tester``/``s3cret`` and signs an RS256 token (x5c: its self-signed
    certificate, which the registry trusts) granting the scope asked for.
    """
    need("docker-registry", "docker-registry")
    from _tokens import TokenService, tokens_missing

    why = tokens_missing()
    if why:
        pytest.skip(why)
    root = tmp_path_factory.mktemp("token-registry")
    with TokenService(root, user="tester", password="s3cret") as service:
        auth = (
            f"{{token: {{realm: '{service.realm}', service: test-registry, "
            f"issuer: test-issuer, rootcertbundle: {service.cert_path}}}}}"
        )
        yield from _serve_registry(root, auth, {"realm": service.realm})


def _serve_registry(root: Path, auth: str, extra: dict[str, str]) -> Iterator[dict[str, str]]:
    binary = need("docker-registry", "docker-registry")
    port = _free_port()
    (root / "config.yml").write_text(
        "version: 0.1\n"
        "log: {level: info, formatter: text}\n"
        f"storage: {{filesystem: {{rootdirectory: {root}/data}}}}\n"
        f"http: {{addr: '127.0.0.1:{port}'}}\n"
        f"auth: {auth}\n"
    )
    proc = subprocess.Popen(
        [binary, "serve", str(root / "config.yml")],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    listening = threading.Event()
    log: list[bytes] = []

    def read_log() -> None:
        # Reads until the server exits, so it never blocks on a full pipe.
        assert proc.stderr is not None
        for line in proc.stderr:
            log.append(line)
            if b"listening on" in line:
                listening.set()

    reader = threading.Thread(target=read_log, daemon=True)
    reader.start()
    try:
        if not listening.wait(20.0):
            raise RuntimeError(f"docker-registry did not start: {b''.join(log)[-2000:]!r}")
        yield {
            "host": f"127.0.0.1:{port}",
            "user": "tester",
            "password": "s3cret",
            "root": str(root),
            **extra,
        }
    finally:
        proc.terminate()
        try:
            proc.wait(5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        reader.join(5)
        assert proc.stderr is not None
        proc.stderr.close()


@pytest.fixture
def store_dir(tmp_path: Path) -> str:
    return str(tmp_path / "cache")
