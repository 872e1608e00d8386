"""The demo's image: an OCI image layout built at run time from what this machine has.

A fresh machine has no task image to pull, but it has what the demo runs on:
bash, this Python interpreter and the pytest the project installs. The image
holds them at their paths, in three layers a task image would have too:

1. the runtime: ``/bin/bash``, the base interpreter (its stdlib without tests,
   IDLE or Tk, its compiled ``.pyc`` files with their sources' times, its
   extension modules) and every shared library ``ldd`` says they load;
2. pytest and what it needs (files listed by their distributions' records),
   in the interpreter's own site-packages: the image's ``python3 -m pytest``;
3. the task: a repository in ``/repo`` (its ``WorkingDir``) whose test fails.

Layers are uncompressed tars; owners are root's, times the host files' own
(the compiled files check them) or fixed: the same machine builds the same
layers, byte for byte.
"""

from __future__ import annotations

import hashlib
import importlib.util
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
from collections.abc import Iterable
from importlib import metadata

__all__ = ["REPO", "build_image"]

#: The task's repository: ``add`` subtracts, and its test says so.
REPO = {
    "calc.py": "def add(a, b):\n    return a - b\n",
    "test_calc.py": "from calc import add\n\n\ndef test_add():\n    assert add(2, 3) == 5\n",
}
_SKIP_STDLIB = {
    "test",
    "tests",
    "idle_test",
    "idlelib",
    "tkinter",
    "turtledemo",
    "lib2to3",
    "ensurepip",
    "pydoc_data",
    "site-packages",
    "dist-packages",
    "venv",
}
_LAYER_TYPE = "application/vnd.oci.image.layer.v1.tar"
_MTIME = 1_700_000_000


class _Layer:
    """One layer's tar in memory, parents before children, each name once."""

    def __init__(self) -> None:
        self.buffer = io.BytesIO()
        # closed by close(), which returns the bytes
        self.tar = tarfile.open(fileobj=self.buffer, mode="w", format=tarfile.PAX_FORMAT)  # noqa: SIM115
        self.names: set[str] = set()

    def _info(self, name: str, kind: bytes, mode: int, mtime: float = _MTIME) -> tarfile.TarInfo:
        info = tarfile.TarInfo(name)
        info.type, info.mode, info.mtime = kind, mode, int(mtime)
        return info

    def parents(self, name: str) -> None:
        parts = name.split("/")
        for i in range(1, len(parts)):
            directory = "/".join(parts[:i])
            if directory not in self.names:
                self.names.add(directory)
                self.tar.addfile(self._info(directory + "/", tarfile.DIRTYPE, 0o755))

    def host_file(self, path: str, name: str = "") -> None:
        """``path`` as the host has it, at ``name`` (default: the same path): a symlink as a
        symlink (and what it names), a file."""
        name = name or path.strip("/")
        if name in self.names:
            return
        if os.path.islink(path) and name == path.strip("/"):
            self.parents(name)
            self.names.add(name)
            info = self._info(name, tarfile.SYMTYPE, 0o777)
            info.linkname = os.readlink(path)
            self.tar.addfile(info)
            target = os.path.join(os.path.dirname(path), info.linkname)
            self.host_file(os.path.normpath(target))
            return
        self.parents(name)
        self.names.add(name)
        st = os.stat(path)
        info = self._info(name, tarfile.REGTYPE, st.st_mode & 0o755, st.st_mtime)
        info.size = st.st_size
        with open(path, "rb") as f:
            self.tar.addfile(info, f)

    def text(self, name: str, content: str) -> None:
        self.parents(name)
        self.names.add(name)
        data = content.encode()
        info = self._info(name, tarfile.REGTYPE, 0o644)
        info.size = len(data)
        self.tar.addfile(info, io.BytesIO(data))

    def symlink(self, name: str, target: str) -> None:
        self.parents(name)
        self.names.add(name)
        info = self._info(name, tarfile.SYMTYPE, 0o777)
        info.linkname = target
        self.tar.addfile(info)

    def close(self) -> bytes:
        self.tar.close()
        return self.buffer.getvalue()


def _interpreter() -> dict[str, str]:
    """Where the base interpreter keeps its parts, as it says itself (``-I``: no venv, no
    user site): the image's python3 is it, not this process's venv."""
    exe = os.path.realpath(os.path.join(sys.base_prefix, "bin", f"python3.{sys.version_info[1]}"))
    if not os.path.exists(exe):
        exe = os.path.realpath(sys.executable)
    script = (
        "import json, site, sys, sysconfig; print(json.dumps({'exe': sys.executable, "
        "'stdlib': sysconfig.get_path('stdlib'), 'platstdlib': sysconfig.get_path('platstdlib'), "
        "'site': site.getsitepackages()[0]}))"
    )
    out = subprocess.run([exe, "-I", "-c", script], capture_output=True, text=True, check=True)
    found: dict[str, str] = json.loads(out.stdout)
    found["exe"] = exe
    return found


def _stdlib_files(roots: Iterable[str]) -> list[str]:
    files: list[str] = []
    tag = f".{sys.implementation.cache_tag}.pyc"
    for root in dict.fromkeys(roots):
        for dirpath, dirnames, filenames in os.walk(root):
            dirnames[:] = sorted(d for d in dirnames if d not in _SKIP_STDLIB)
            if os.path.relpath(dirpath, root).startswith("config-"):
                continue
            files += [
                os.path.join(dirpath, f)
                for f in sorted(filenames)
                if f.endswith((".py", ".so", tag))
            ]
    return files


def _libraries(binaries: list[str]) -> list[str]:
    """The shared libraries ``binaries`` load (one ``ldd`` call for all)."""
    out = subprocess.run(["ldd", *binaries], capture_output=True, text=True).stdout
    words = (word for line in out.splitlines() for word in line.split())
    return sorted({w for w in words if w.startswith("/") and not w.endswith(":")})


def _runtime_layer(python: dict[str, str]) -> bytes:
    layer = _Layer()
    bash = shutil.which("bash", path="/bin:/usr/bin") or "/bin/bash"
    stdlib = _stdlib_files([python["stdlib"], python["platstdlib"]])
    binaries = [bash, python["exe"]] + [f for f in stdlib if f.endswith(".so")]
    for path in [bash, python["exe"], *_libraries(binaries), *stdlib]:
        layer.host_file(path)
    if bash != "/bin/bash":
        layer.symlink("bin/bash", bash)
    layer.symlink("usr/local/bin/python3", python["exe"])
    layer.text("etc/os-release", "ID=toolservices-demo\nNAME=toolservices demo image\n")
    layer.parents("tmp/x")
    return layer.close()


def _closure(name: str) -> list[metadata.Distribution]:
    """``name``'s distribution and those it requires here (markers evaluated, no extras)."""
    from packaging.requirements import Requirement  # pytest's own dependency

    found: dict[str, metadata.Distribution] = {}
    todo = [name]
    while todo:
        wanted = todo.pop()
        if wanted.lower() in found:
            continue
        dist = metadata.distribution(wanted)
        found[wanted.lower()] = dist
        for text in dist.requires or ():
            req = Requirement(text)
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                todo.append(req.name)
    return list(found.values())


def _pytest_layer(site: str) -> bytes:
    """pytest and the distributions it needs, as installed here, in the image's site-packages."""
    layer = _Layer()
    for dist in _closure("pytest"):
        for file in dist.files or ():
            path = os.path.normpath(str(file.locate()))
            if ".." in str(file) or "__pycache__" in str(file) or not os.path.isfile(path):
                continue  # a console script in bin/, compiled files
            layer.host_file(path, os.path.join(site, str(file)).strip("/"))
            if path.endswith(".py"):  # compiled here already: pytest starts at once
                compiled = importlib.util.cache_from_source(path)
                if os.path.isfile(compiled):
                    relative = os.path.relpath(compiled, str(dist.locate_file("")))
                    layer.host_file(compiled, os.path.join(site, relative).strip("/"))
    return layer.close()


def build_image(dest: str) -> str:
    """Write the demo's OCI image layout at ``dest``; its ``oci:`` reference."""
    if importlib.util.find_spec("pytest") is None:
        raise FileNotFoundError("pytest is not installed here (pip install 'toolservices[dev]')")
    python = _interpreter()
    repo = _Layer()
    for name, content in REPO.items():
        repo.text(f"repo/{name}", content)
    layers = [_runtime_layer(python), _pytest_layer(python["site"]), repo.close()]
    bin_dir = os.path.dirname(python["exe"])
    env = [f"PATH=/usr/local/bin:{bin_dir}:/usr/bin:/bin", "LANG=C.UTF-8"]
    _write_layout(dest, layers, env=env, working_dir="/repo")
    return f"oci:{dest}"


def _blob(dest: str, data: bytes) -> dict[str, object]:
    digest = hashlib.sha256(data).hexdigest()
    with open(os.path.join(dest, "blobs", "sha256", digest), "wb") as f:
        f.write(data)
    return {"digest": f"sha256:{digest}", "size": len(data)}


def _write_layout(dest: str, layers: list[bytes], *, env: list[str], working_dir: str) -> None:
    os.makedirs(os.path.join(dest, "blobs", "sha256"), exist_ok=True)
    descriptors = [{"mediaType": _LAYER_TYPE, **_blob(dest, data)} for data in layers]
    config = {
        "architecture": {"x86_64": "amd64", "aarch64": "arm64"}.get(os.uname().machine, "amd64"),
        "os": "linux",
        "config": {"Env": env, "WorkingDir": working_dir},
        "rootfs": {"type": "layers", "diff_ids": [d["digest"] for d in descriptors]},
    }
    manifest = {
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {
            "mediaType": "application/vnd.oci.image.config.v1+json",
            **_blob(dest, json.dumps(config).encode()),
        },
        "layers": descriptors,
    }
    entry = {
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        **_blob(dest, json.dumps(manifest).encode()),
    }
    with open(os.path.join(dest, "index.json"), "w") as f:
        json.dump({"schemaVersion": 2, "manifests": [entry]}, f)
    with open(os.path.join(dest, "oci-layout"), "w") as f:
        json.dump({"imageLayoutVersion": "1.0.0"}, f)
