"""Build real test images: OCI layouts written here, converted with skopeo.

A layer is a list of :class:`Entry`; :func:`oci_layout` writes the blobs
(gzip, zstd or plain), the config with its diff_ids, the manifest and
index.json, exactly as the image spec lays them out.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import shutil
import subprocess
import tarfile
import tempfile
from dataclasses import dataclass, field

BUSYBOX = "/bin/busybox"
APPLETS = (
    "sh",
    "ls",
    "cat",
    "echo",
    "rm",
    "touch",
    "id",
    "mkdir",
    "env",
    "pwd",
    "wget",
    "nc",
    "httpd",
    "sleep",
    "ps",
    "grep",
    "test",
    "true",
    "stat",
    "chmod",
)


@dataclass
class Entry:
    name: str
    data: bytes = b""
    kind: bytes = tarfile.REGTYPE
    mode: int = 0o644
    link: str = ""
    uid: int = 0


@dataclass
class Layer:
    entries: list[Entry] = field(default_factory=list)
    compression: str = "gzip"


def layer_tar(entries: list[Entry]) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for e in entries:
            info = tarfile.TarInfo(e.name)
            info.type = e.kind
            info.mode = e.mode
            info.uid = info.gid = e.uid
            info.mtime = 1_700_000_000
            info.linkname = e.link
            if e.kind == tarfile.REGTYPE:
                info.size = len(e.data)
                tar.addfile(info, io.BytesIO(e.data))
            else:
                tar.addfile(info)
    return out.getvalue()


def compress(data: bytes, how: str) -> tuple[bytes, str]:
    base = "application/vnd.oci.image.layer.v1.tar"
    if how == "gzip":
        return gzip.compress(data, mtime=0), base + "+gzip"
    if how == "zstd":
        try:
            from compression import zstd  # type: ignore[import-not-found]
        except ImportError:
            from backports import zstd
        return zstd.compress(data), base + "+zstd"
    return data, base


def busybox_layer(compression: str = "gzip") -> Layer:
    with open(BUSYBOX, "rb") as f:
        binary = f.read()
    entries = [
        Entry("bin/", kind=tarfile.DIRTYPE, mode=0o755),
        Entry("bin/busybox", binary, mode=0o755),
    ]
    entries += [Entry(f"bin/{a}", kind=tarfile.SYMTYPE, link="busybox") for a in APPLETS]
    entries += [
        Entry("etc/", kind=tarfile.DIRTYPE, mode=0o755),
        Entry("etc/os-release", b"ID=testbox\n"),
        Entry("repo/", kind=tarfile.DIRTYPE, mode=0o755),
        Entry("repo/task.txt", b"fix me\n", mode=0o644),
        Entry("tmp/", kind=tarfile.DIRTYPE, mode=0o1777),
    ]
    return Layer(entries, compression)


def _blob(root: str, data: bytes) -> str:
    digest = hashlib.sha256(data).hexdigest()
    os.makedirs(os.path.join(root, "blobs", "sha256"), exist_ok=True)
    with open(os.path.join(root, "blobs", "sha256", digest), "wb") as f:
        f.write(data)
    return "sha256:" + digest


def oci_layout(
    root: str,
    layers: list[Layer],
    *,
    tag: str = "latest",
    env: tuple[str, ...] = ("PATH=/bin:/usr/bin",),
    workdir: str = "/repo",
    base: tuple[dict[str, object], str] | None = None,
) -> str:
    """Write an OCI image layout at ``root``; returns the manifest digest.

    ``base``: a layer already in the blobs (its descriptor and diff_id), laid first."""
    descriptors: list[dict[str, object]] = [base[0]] if base else []
    diff_ids = [base[1]] if base else []
    for layer in layers:
        raw = layer_tar(layer.entries)
        diff_ids.append("sha256:" + hashlib.sha256(raw).hexdigest())
        data, media = compress(raw, layer.compression)
        descriptors.append({"mediaType": media, "digest": _blob(root, data), "size": len(data)})
    config = json.dumps(
        {
            "architecture": "amd64",
            "os": "linux",
            "config": {
                "Env": list(env),
                "WorkingDir": workdir,
                "User": "1000",
                "Cmd": ["/bin/sh", "-c", "exit 3"],
            },
            "rootfs": {"type": "layers", "diff_ids": diff_ids},
        }
    ).encode()
    config_digest = _blob(root, config)
    manifest = json.dumps(
        {
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": {
                "mediaType": "application/vnd.oci.image.config.v1+json",
                "digest": config_digest,
                "size": len(config),
            },
            "layers": descriptors,
        }
    ).encode()
    manifest_digest = _blob(root, manifest)
    index_path = os.path.join(root, "index.json")
    index = {"schemaVersion": 2, "manifests": []}
    if os.path.exists(index_path):
        with open(index_path) as f:
            index = json.load(f)
    index["manifests"].append(
        {
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "digest": manifest_digest,
            "size": len(manifest),
            "annotations": {"org.opencontainers.image.ref.name": tag},
        }
    )
    with open(index_path, "w") as f:
        json.dump(index, f)
    with open(os.path.join(root, "oci-layout"), "w") as f:
        json.dump({"imageLayoutVersion": "1.0.0"}, f)
    return manifest_digest


def skopeo() -> str | None:
    return shutil.which("skopeo")


def skopeo_copy(src: str, dest: str, *extra: str) -> None:
    """Convert with the real skopeo (its policy file: accept anything, local only)."""
    with tempfile.TemporaryDirectory() as tmp:
        policy = os.path.join(tmp, "policy.json")
        with open(policy, "w") as f:
            json.dump({"default": [{"type": "insecureAcceptAnything"}]}, f)
        subprocess.run(
            [skopeo() or "skopeo", "--policy", policy, "copy", "-q", *extra, src, dest],
            check=True,
            capture_output=True,
            timeout=60,
        )


def bash_layer(compression: str = "gzip") -> Layer:
    """The host's bash and the libraries it loads, at their paths: enough for a shell session."""
    out = subprocess.run(["ldd", "/bin/bash"], capture_output=True, text=True, check=True).stdout
    files = ["/bin/bash"] + [
        p for line in out.splitlines() for p in line.split() if p.startswith("/")
    ]
    entries: list[Entry] = []
    seen: set[str] = set()
    for path in files:
        real = os.path.realpath(path)
        for name, target in ((path, real), (real, real)):
            parts = name.strip("/").split("/")
            for i in range(1, len(parts)):
                d = "/".join(parts[:i]) + "/"
                if d not in seen and not os.path.islink("/" + d.rstrip("/")):
                    seen.add(d)
                    entries.append(Entry(d, kind=tarfile.DIRTYPE, mode=0o755))
            key = "/".join(parts)
            if key in seen:
                continue
            seen.add(key)
            if name != target:
                entries.append(Entry(key, kind=tarfile.SYMTYPE, link=target))
            else:
                with open(target, "rb") as f:
                    entries.append(Entry(key, f.read(), mode=0o755))
    return Layer(entries, compression)


def oci_layout_from_rootfs(
    root: str, rootfs_tar: str, layers: list[Layer], *, tag: str = "latest"
) -> str:
    """An OCI layout whose bottom layer is ``rootfs_tar`` as it is (uncompressed), then
    ``layers``: a distribution made by mmdebstrap, with the task's files on top."""
    os.makedirs(os.path.join(root, "blobs", "sha256"), exist_ok=True)
    digest = hashlib.sha256()
    with open(rootfs_tar, "rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    target = os.path.join(root, "blobs", "sha256", digest.hexdigest())
    if not os.path.exists(target):
        try:
            os.link(rootfs_tar, target)
        except OSError:
            shutil.copyfile(rootfs_tar, target)
    base = {
        "mediaType": "application/vnd.oci.image.layer.v1.tar",
        "digest": "sha256:" + digest.hexdigest(),
        "size": os.path.getsize(rootfs_tar),
    }
    return oci_layout(
        root,
        layers,
        tag=tag,
        base=(base, "sha256:" + digest.hexdigest()),
        env=("PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "LANG=C.UTF-8"),
    )
