"""Pulling from a real registry (Debian's docker-registry on 127.0.0.1, pushed to by skopeo)."""

from __future__ import annotations

import base64
import json
import os
import socket
from pathlib import Path

import pytest
from _build import skopeo, skopeo_copy

from toolservices.images import ImageError, ImageNotFoundError, ImageStore, RegistryAuthError


def _auth_file(path: Path, host: str, user: str, password: str) -> str:
    token = base64.b64encode(f"{user}:{password}".encode()).decode()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"auths": {host: {"auth": token}}}))
    return str(path)


@pytest.fixture(scope="module")
def pushed(
    registry: dict[str, str], busybox_oci: str, tmp_path_factory: pytest.TempPathFactory
) -> str:
    if skopeo() is None:
        pytest.skip("skopeo is not installed (Debian package skopeo; .ci/run installs it)")
    work = tmp_path_factory.mktemp("push")
    skopeo_copy(
        f"oci:{busybox_oci}:latest",
        f"docker://{registry['host']}/team/busybox:1.0",
        "--dest-tls-verify=false",
        f"--dest-creds={registry['user']}:{registry['password']}",
    )
    assert work.exists()
    return f"docker://{registry['host']}/team/busybox:1.0"


def test_pull_with_credentials_from_the_containers_auth_file(
    pushed: str,
    registry: dict[str, str],
    store_dir: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path / "run"))
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.delenv("REGISTRY_AUTH_FILE", raising=False)
    _auth_file(
        tmp_path / "run/containers/auth.json",
        registry["host"],
        registry["user"],
        registry["password"],
    )
    store = ImageStore(store_dir)
    image = store.pull(pushed, insecure_registries=(registry["host"],))
    assert os.path.islink(os.path.join(image.layers[0], "bin/sh"))
    assert image.working_dir == "/repo"
    by_digest = pushed.rsplit(":", 1)[0] + "@" + image.digest
    assert store.pull(by_digest, insecure_registries=(registry["host"],)).layers == image.layers


def test_docker_config_and_missing_tag(
    pushed: str,
    registry: dict[str, str],
    store_dir: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("XDG_RUNTIME_DIR", raising=False)
    monkeypatch.delenv("DOCKER_CONFIG", raising=False)
    monkeypatch.delenv("REGISTRY_AUTH_FILE", raising=False)
    _auth_file(
        tmp_path / ".docker/config.json",
        f"http://{registry['host']}",
        registry["user"],
        registry["password"],
    )
    with pytest.raises(ImageNotFoundError, match="not found"):
        ImageStore(store_dir).pull(
            pushed.replace(":1.0", ":9.9"), insecure_registries=(registry["host"],)
        )
    assert not os.path.exists(os.path.join(store_dir, "layers"))


def test_wrong_password_and_no_login(
    pushed: str,
    registry: dict[str, str],
    store_dir: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    wrong = _auth_file(tmp_path / "auth.json", registry["host"], registry["user"], "nope")
    with pytest.raises(RegistryAuthError, match="refused the credentials") as info:
        ImageStore(store_dir).pull(pushed, insecure_registries=(registry["host"],), auth_file=wrong)
    assert not info.value.retryable
    monkeypatch.setenv("HOME", str(tmp_path / "nobody"))
    monkeypatch.delenv("XDG_RUNTIME_DIR", raising=False)
    monkeypatch.delenv("REGISTRY_AUTH_FILE", raising=False)
    with pytest.raises(RegistryAuthError, match="needs a login"):
        ImageStore(store_dir).pull(pushed, insecure_registries=(registry["host"],))
    assert not os.path.exists(os.path.join(store_dir, "layers"))


def test_unreachable_registry_is_retryable(store_dir: str) -> None:
    with socket.socket() as s:  # a port nothing listens on: bound, never listening
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        with pytest.raises(ImageError, match="could not reach the registry") as info:
            ImageStore(store_dir).pull(
                f"docker://127.0.0.1:{port}/a/b:1", insecure_registries=(f"127.0.0.1:{port}",)
            )
    assert info.value.retryable


def test_bearer_token_exchange_with_a_real_token_service(
    token_registry: dict[str, str], busybox_oci: str, store_dir: str, tmp_path: Path
) -> None:
    if skopeo() is None:
        pytest.skip("skopeo is not installed (Debian package skopeo; .ci/run installs it)")
    host = token_registry["host"]
    skopeo_copy(
        f"oci:{busybox_oci}:latest",
        f"docker://{host}/team/tok:1",
        "--dest-tls-verify=false",
        "--dest-creds=tester:s3cret",
    )
    good = _auth_file(tmp_path / "good.json", host, "tester", "s3cret")
    image = ImageStore(store_dir).pull(
        f"docker://{host}/team/tok:1", insecure_registries=(host,), auth_file=good
    )
    assert os.path.islink(os.path.join(image.layers[0], "bin/sh"))
    bad = _auth_file(tmp_path / "bad.json", host, "tester", "wrong")
    with pytest.raises(RegistryAuthError, match="token service refused the credentials"):
        ImageStore(store_dir + "2").pull(
            f"docker://{host}/team/tok:1", insecure_registries=(host,), auth_file=bad
        )
