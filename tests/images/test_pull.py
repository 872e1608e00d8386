"""Pulling real images into the layer cache: every transport, layers, whiteouts, errors."""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import tarfile
from pathlib import Path

import pytest
from _build import Entry, Layer, busybox_layer, oci_layout, skopeo, skopeo_copy

from toolservices.errors import UserError
from toolservices.images import (
    ImageError,
    ImageNotFoundError,
    ImageStore,
    parse_ref,
)


def _tree(root: str) -> set[str]:
    return {
        os.path.relpath(os.path.join(d, n), root)
        for d, dirs, files in os.walk(root)
        for n in dirs + files
    }


def test_references_parse_and_bad_ones_name_the_forms() -> None:
    assert parse_ref("oci:/x/y:v1").tag == "v1"
    assert parse_ref("oci:/x/y").tag is None
    ref = parse_ref("docker://127.0.0.1:5000/team/app:2.0")
    assert (ref.host, ref.name, ref.tag) == ("127.0.0.1:5000", "team/app", "2.0")
    digest = "sha256:" + "a" * 64
    assert parse_ref(f"docker://h.io/app@{digest}").digest == digest
    assert parse_ref("docker://busybox").name == "library/busybox"
    assert str(parse_ref("docker://127.0.0.1:5000/a:b")) == "docker://127.0.0.1:5000/a:b"
    for bad in (
        "busybox",
        "podman:/x",
        "docker://h.io/App:1",
        "oci:/x:bad tag",
        "docker://h.io/a@sha256:12",
    ):
        with pytest.raises(UserError, match="image reference"):
            parse_ref(bad)


def test_oci_layout_unpacks_once_and_layers_are_shared(busybox_oci: str, store_dir: str) -> None:
    store = ImageStore(store_dir)
    image = store.pull(f"oci:{busybox_oci}:latest")
    assert image.digest.startswith("sha256:") and len(image.layers) == 1
    assert image.path == "/bin:/usr/bin" and image.working_dir == "/repo"
    layer = image.layers[0]
    assert os.path.islink(os.path.join(layer, "bin/sh"))
    assert os.access(os.path.join(layer, "bin/busybox"), os.X_OK)
    inode = os.stat(os.path.join(layer, "bin/busybox")).st_ino
    again = store.pull(f"oci:{busybox_oci}")  # one image: no tag needed
    assert again.layers == image.layers
    assert os.stat(os.path.join(layer, "bin/busybox")).st_ino == inode  # not unpacked again
    assert [i.digest for i in store.list()] == [image.digest]
    assert store.used_bytes() == image.size > 1_000_000


@pytest.mark.parametrize("compression", ["gzip", "zstd", "none"])
def test_whiteouts_and_opaque_directories_become_overlay_xattrs(
    tmp_path: Path, store_dir: str, compression: str
) -> None:
    base = Layer(
        [
            Entry("etc/", kind=tarfile.DIRTYPE),
            Entry("etc/a", b"a"),
            Entry("etc/b", b"b"),
            Entry("opt/", kind=tarfile.DIRTYPE),
            Entry("opt/old", b"o"),
        ],
        "gzip",
    )
    top = Layer(
        [
            Entry("etc/.wh.a"),
            Entry("opt/.wh..wh..opq"),
            Entry("opt/new", b"n"),
            Entry("etc/link", kind=tarfile.SYMTYPE, link="/etc/b"),
            Entry("etc/hard", kind=tarfile.LNKTYPE, link="opt/new"),
            Entry("etc/fifo", kind=tarfile.FIFOTYPE),
            Entry("dev/null", kind=tarfile.CHRTYPE),
            Entry("etc/suid", b"#!", mode=0o4755),
        ],
        compression,
    )
    oci_layout(str(tmp_path / "oci"), [base, top])
    image = ImageStore(store_dir).pull(f"oci:{tmp_path}/oci:latest")
    upper = image.layers[1]
    assert os.getxattr(f"{upper}/etc/a", "user.overlay.whiteout") == b"y"
    assert os.path.getsize(f"{upper}/etc/a") == 0
    assert os.getxattr(f"{upper}/etc", "user.overlay.opaque") == b"x"
    assert os.getxattr(f"{upper}/opt", "user.overlay.opaque") == b"y"
    assert os.readlink(f"{upper}/etc/link") == "/etc/b"
    assert os.stat(f"{upper}/etc/hard").st_ino == os.stat(f"{upper}/opt/new").st_ino
    assert not os.path.exists(f"{upper}/dev/null")  # device nodes dropped
    assert os.stat(f"{upper}/etc/suid").st_mode & 0o7777 == 0o755


def test_archives_made_by_skopeo(busybox_oci: str, tmp_path: Path, store_dir: str) -> None:
    if skopeo() is None:
        pytest.skip("skopeo is not installed (Debian package skopeo; .ci/run installs it)")
    skopeo_copy(f"oci:{busybox_oci}:latest", f"docker-archive:{tmp_path}/d.tar")
    skopeo_copy(f"oci:{busybox_oci}:latest", f"oci-archive:{tmp_path}/o.tar:v1")
    store = ImageStore(store_dir)
    from_docker = store.pull(f"docker-archive:{tmp_path}/d.tar")
    from_oci = store.pull(f"oci-archive:{tmp_path}/o.tar:v1")
    assert from_docker.layers == from_oci.layers  # same diff_id, one copy
    assert from_docker.working_dir == "/repo"
    assert len(store.list()) == 2
    store.remove(f"docker-archive:{tmp_path}/d.tar")
    assert os.path.isdir(from_oci.layers[0])  # still used
    store.remove(from_oci.digest)
    assert store.list() == [] and not os.path.exists(from_oci.layers[0])
    with pytest.raises(ImageNotFoundError, match="no image"):
        store.remove("oci:/nowhere")


def test_dir_reference_is_used_in_place(tmp_path: Path, store_dir: str) -> None:
    (tmp_path / "root").mkdir()
    image = ImageStore(store_dir).pull(f"dir:{tmp_path}/root")
    assert image.layers == (str(tmp_path / "root"),) and image.digest == f"dir:{tmp_path}/root"
    with pytest.raises(ImageNotFoundError, match="not a directory"):
        ImageStore(store_dir).pull(f"dir:{tmp_path}/missing")


# -- bad input: a clear error, nothing touched ------------------------------------------


def _untouched(store_dir: str) -> None:
    for sub in ("layers", "images"):
        path = os.path.join(store_dir, sub)
        assert not os.path.exists(path) or os.listdir(path) == [], os.listdir(path)
    tmp = os.path.join(store_dir, "tmp")
    assert not os.path.exists(tmp) or os.listdir(tmp) == []


def test_missing_path_and_tag(busybox_oci: str, tmp_path: Path, store_dir: str) -> None:
    store = ImageStore(store_dir)
    with pytest.raises(ImageNotFoundError, match="does not exist"):
        store.pull(f"oci:{tmp_path}/nothing")
    with pytest.raises(ImageNotFoundError, match="no tag 'v9' .tags: latest"):
        store.pull(f"oci:{busybox_oci}:v9")
    with pytest.raises(ImageNotFoundError, match="not an OCI image layout"):
        store.pull(f"oci:{tmp_path}")
    with pytest.raises(ImageNotFoundError, match="no manifest.json"):
        (tmp_path / "empty.tar").write_bytes(b"\0" * 1024)
        store.pull(f"docker-archive:{tmp_path}/empty.tar")
    _untouched(store_dir)


def test_corrupted_blob_is_named(tmp_path: Path, store_dir: str) -> None:
    oci_layout(str(tmp_path / "oci"), [busybox_layer("gzip"), Layer([Entry("x", b"1")], "none")])
    with open(tmp_path / "oci/index.json") as f:
        manifest_digest = json.load(f)["manifests"][0]["digest"].split(":")[1]
    manifest = json.loads((tmp_path / "oci/blobs/sha256" / manifest_digest).read_bytes())
    victim = manifest["layers"][1]["digest"]
    blob = tmp_path / "oci/blobs/sha256" / victim.split(":")[1]
    blob.write_bytes(blob.read_bytes().replace(b"1", b"2"))
    with pytest.raises(ImageError, match=f"layer {victim}.*does not match its digest"):
        ImageStore(store_dir).pull(f"oci:{tmp_path}/oci")
    _untouched(store_dir)  # the first, good layer was not kept either


def test_truncated_archive(busybox_oci: str, tmp_path: Path, store_dir: str) -> None:
    if skopeo() is None:
        pytest.skip("skopeo is not installed (Debian package skopeo; .ci/run installs it)")
    skopeo_copy(f"oci:{busybox_oci}:latest", f"oci-archive:{tmp_path}/o.tar")
    data = (tmp_path / "o.tar").read_bytes()
    (tmp_path / "cut.tar").write_bytes(data[: len(data) // 2])
    with pytest.raises(ImageError, match="truncated|missing|cut short|bytes"):
        ImageStore(store_dir).pull(f"oci-archive:{tmp_path}/cut.tar")
    _untouched(store_dir)


@pytest.mark.parametrize(
    ("entries", "message"),
    [
        ([Entry("../escape", b"x")], "leaves the image root"),
        ([Entry("a/../../escape", b"x")], "leaves the image root"),
        ([Entry("/abs", b"x")], "absolute path"),
        (
            [Entry("out", kind=tarfile.SYMTYPE, link="{outside}"), Entry("out/escape", b"x")],
            "not a directory in this layer",
        ),
        (
            [Entry("d", kind=tarfile.SYMTYPE, link="../../.."), Entry("d/x/escape", b"x")],
            "not a directory in this layer",
        ),
        ([Entry("h", kind=tarfile.LNKTYPE, link="{outside}/victim")], "absolute path"),
        ([Entry("h", kind=tarfile.LNKTYPE, link="../victim")], "leaves the image root"),
        (
            [
                Entry("s", kind=tarfile.SYMTYPE, link="{outside}"),
                Entry("h", kind=tarfile.LNKTYPE, link="s/victim"),
            ],
            "not a directory in this layer",
        ),
        (
            [
                Entry("s", kind=tarfile.SYMTYPE, link="{outside}/victim"),
                Entry("h", kind=tarfile.LNKTYPE, link="s"),
            ],
            "does not name a regular file",
        ),
    ],
)
def test_escaping_entries_touch_nothing_outside(
    tmp_path: Path, store_dir: str, entries: list[Entry], message: str
) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "victim").write_bytes(b"keep")
    for e in entries:
        e.link = e.link.replace("{outside}", str(outside))
    oci_layout(str(tmp_path / "oci"), [Layer(entries, "gzip")])
    before = _tree(str(tmp_path))
    with pytest.raises(ImageError, match=message):
        ImageStore(store_dir).pull(f"oci:{tmp_path}/oci")
    assert (outside / "victim").read_bytes() == b"keep"
    assert os.listdir(outside) == ["victim"]
    assert not (tmp_path / "escape").exists() and not (tmp_path.parent / "escape").exists()
    assert {p for p in _tree(str(tmp_path)) if not p.startswith("cache")} == {
        p for p in before if not p.startswith("cache")
    }
    _untouched(store_dir)


def test_image_larger_than_the_budget(busybox_oci: str, store_dir: str) -> None:
    with pytest.raises(ImageError, match="budget of 1 MiB"):
        ImageStore(store_dir, max_bytes=1 << 20).pull(f"oci:{busybox_oci}")
    _untouched(store_dir)
    with pytest.raises(UserError, match="max_bytes"):
        ImageStore(store_dir, max_bytes=0)


def test_prune_removes_unused_layers_and_stale_staging(busybox_oci: str, store_dir: str) -> None:
    store = ImageStore(store_dir)
    image = store.pull(f"oci:{busybox_oci}")
    os.makedirs(os.path.join(store_dir, "tmp", "pull-dead", "0", "ro"))
    os.chmod(os.path.join(store_dir, "tmp", "pull-dead", "0"), 0o500)
    assert store.prune() == 0
    assert os.listdir(os.path.join(store_dir, "tmp")) == []
    os.unlink(os.path.join(store_dir, "images", image.digest.split(":")[1] + ".json"))
    assert store.prune() == image.size
    _untouched(store_dir)


def test_gzip_layer_with_wrong_diff_id(tmp_path: Path, store_dir: str) -> None:
    oci_layout(str(tmp_path / "oci"), [Layer([Entry("x", b"1")], "gzip")])
    index = json.loads((tmp_path / "oci/index.json").read_text())
    blobs = tmp_path / "oci/blobs/sha256"
    old = index["manifests"][0]["digest"].split(":")[1]
    manifest = json.loads((blobs / old).read_bytes())
    config = json.loads((blobs / manifest["config"]["digest"].split(":")[1]).read_bytes())
    config["rootfs"]["diff_ids"] = ["sha256:" + "0" * 64]
    data = json.dumps(config).encode()
    digest = hashlib.sha256(data).hexdigest()
    (blobs / digest).write_bytes(data)
    manifest["config"] = {
        "digest": f"sha256:{digest}",
        "size": len(data),
        "mediaType": "application/vnd.oci.image.config.v1+json",
    }
    mdata = json.dumps(manifest).encode()
    mdigest = hashlib.sha256(mdata).hexdigest()
    (blobs / mdigest).write_bytes(mdata)
    index["manifests"][0]["digest"] = f"sha256:{mdigest}"
    (tmp_path / "oci/index.json").write_text(json.dumps(index))
    with pytest.raises(ImageError, match=r"\(uncompressed\).*does not match its digest"):
        ImageStore(store_dir).pull(f"oci:{tmp_path}/oci")
    assert gzip  # the layer was gzip: both digests are checked
    _untouched(store_dir)


def test_cli_pull_ls_rm_prune(
    busybox_oci: str, store_dir: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from toolservices.cli.main import main

    assert main(["image", "--cache", store_dir, "pull", f"oci:{busybox_oci}"]) == 0
    digest = capsys.readouterr().out.split()[0]
    assert main(["image", "--cache", store_dir, "ls"]) == 0
    listing = capsys.readouterr().out
    assert digest[7:19] in listing and f"oci:{busybox_oci}" in listing
    assert main(["image", "--cache", store_dir, "rm", digest]) == 0
    assert main(["image", "--cache", store_dir, "prune"]) == 0
    assert "freed 0.0 MiB" in capsys.readouterr().out
    assert main(["image", "--cache", store_dir, "pull", "oci:/nowhere"]) == 1
    assert "does not exist" in capsys.readouterr().err
    _untouched(store_dir)


def _index_layout(root: Path, arches: list[str]) -> None:
    """An OCI layout whose one tag is an image index over ``arches`` (same image each)."""
    oci_layout(str(root), [Layer([Entry("x", b"1")], "gzip")])
    index = json.loads((root / "index.json").read_text())
    manifest = index["manifests"][0]
    inner = {
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.index.v1+json",
        "manifests": [
            {
                **{k: manifest[k] for k in ("mediaType", "digest", "size")},
                "platform": {"os": "linux", "architecture": arch},
            }
            for arch in arches
        ],
    }
    data = json.dumps(inner).encode()
    digest = hashlib.sha256(data).hexdigest()
    (root / "blobs/sha256" / digest).write_bytes(data)
    index["manifests"] = [
        {
            "mediaType": inner["mediaType"],
            "digest": f"sha256:{digest}",
            "size": len(data),
            "annotations": {"org.opencontainers.image.ref.name": "multi"},
        }
    ]
    (root / "index.json").write_text(json.dumps(index))


def test_an_index_resolves_to_this_machines_platform(tmp_path: Path, store_dir: str) -> None:
    import platform

    arch = {"x86_64": "amd64", "aarch64": "arm64"}.get(platform.machine(), platform.machine())
    _index_layout(tmp_path / "multi", ["s390x", arch])
    image = ImageStore(store_dir).pull(f"oci:{tmp_path}/multi:multi")
    assert os.path.exists(os.path.join(image.layers[0], "x"))
    _index_layout(tmp_path / "other", ["s390x" if arch != "s390x" else "ppc64le"])
    with pytest.raises(ImageNotFoundError, match=f"no image for linux/{arch}"):
        ImageStore(store_dir).pull(f"oci:{tmp_path}/other:multi")


def test_async_pull_and_the_default_cache_dir(
    busybox_oci: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import anyio

    from toolservices.images import apull, default_cache_dir

    monkeypatch.setenv("TOOLSERVICES_IMAGE_CACHE", str(tmp_path / "env-cache"))
    assert default_cache_dir() == str(tmp_path / "env-cache")
    monkeypatch.delenv("TOOLSERVICES_IMAGE_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert default_cache_dir() == str(tmp_path / "xdg/toolservices/images")
    image = anyio.run(lambda: apull(ImageStore(), f"oci:{busybox_oci}"))
    assert image.layers[0].startswith(str(tmp_path / "xdg/toolservices/images/layers/"))


def test_a_deep_tree_laid_twice_and_removed(tmp_path: Path, store_dir: str) -> None:
    """A layer nesting 1,500 directories (read-only ones among them), then the same name as
    a file: the tree goes without recursion; ``rm`` removes it from the cache again."""
    deep = "d/" * 1500
    entries = [Entry("d/" * (i + 1), kind=tarfile.DIRTYPE, mode=0o555) for i in range(1500)]
    entries += [Entry(f"{deep}f", b"x"), Entry("d", b"now a file")]
    oci_layout(str(tmp_path / "oci"), [Layer(entries, "gzip")])
    store = ImageStore(store_dir)
    image = store.pull(f"oci:{tmp_path}/oci")
    assert Path(image.layers[0], "d").read_bytes() == b"now a file"
    nested = [Entry("d/" * (i + 1), kind=tarfile.DIRTYPE, mode=0o555) for i in range(1500)]
    oci_layout(str(tmp_path / "oci2"), [Layer(nested, "gzip")])
    kept = store.pull(f"oci:{tmp_path}/oci2")
    store.remove(kept.digest)
    assert not os.path.exists(kept.layers[0])
