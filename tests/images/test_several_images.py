"""Several images per ShellService: ``start_session(session_id, image=other)``.

Two test images that share their busybox and bash layers (so the cache holds one
copy of those), each with a layer and an Env of its own; and the Debian image of
``test_debian.py`` as a session of a service on the busybox one.
"""

from __future__ import annotations

import functools
import json
import os
import pickle
import tarfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from _build import Entry, Layer, bash_layer, busybox_layer, oci_layout
from test_debian import ROOTFS, task_layer

from toolservices.errors import UserError
from toolservices.images import ImageNotFoundError
from toolservices.shell import ShellService


def _own_layer(directory: str, text: bytes) -> Layer:
    return Layer(
        [Entry(f"{directory}/", kind=tarfile.DIRTYPE, mode=0o755), Entry(f"{directory}/id", text)],
        "gzip",
    )


@pytest.fixture(scope="module")
def images(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("several")
    base = [busybox_layer("gzip"), bash_layer("gzip")]
    oci_layout(
        str(root / "a"), [*base, _own_layer("repo", b"A\n")], env=("PATH=/bin", "FOO=a", "ONLY_A=1")
    )
    oci_layout(
        str(root / "b"),
        [*base, _own_layer("task", b"B\n")],
        env=("PATH=/bin:/usr/bin", "FOO=b", "ONLY_B=yes"),
        workdir="/task",
    )
    oci_layout(str(root / "c"), [busybox_layer("gzip")])  # no bash
    return {
        "a": f"oci:{root}/a",
        "b": f"oci:{root}/b",
        "nobash": f"oci:{root}/c",
        "cache": str(root / "cache"),
    }


@pytest.fixture(scope="module")
def shell(images: dict[str, str]) -> Iterator[ShellService]:
    with ShellService(
        pool_size=2, timeout=20.0, max_sessions=8, image=images["a"], image_cache=images["cache"]
    ) as service:
        report = service.isolation_report()
        if not report["layers"]["session_namespaces"]["active"]:
            pytest.skip(f"no session namespaces here: {report['layers']['session_namespaces']}")
        yield service


def test_a_session_on_another_image(shell: ShellService, images: dict[str, str]) -> None:
    assert shell.start_session("on-b", image=images["b"]) == "on-b"
    b = shell.run(
        "pwd; cat /task/id; echo $FOO $ONLY_B ${ONLY_A-unset}; "
        "test -e /repo/id || echo no-repo; id -u",
        session_id="on-b",
    )
    assert b.stdout == "/task\nB\nb yes unset\nno-repo\n0\n", b
    a = shell.run(
        "pwd; cat /repo/id; echo $FOO ${ONLY_B-unset}; test -e /task || echo no-task",
        session_id="on-a",
    )
    assert a.stdout == "/repo\nA\na unset\nno-task\n", a
    report = shell.isolation_report()
    assert report["image"]["reference"] == images["a"]
    assert report["session_images"]["on-b"]["reference"] == images["b"]
    assert report["session_images"]["on-b"]["digest"].startswith("sha256:")
    assert "on-a" not in report["session_images"]
    # the file tools act in the session's own root
    shell.write_file("/task/new", "x\n", session_id="on-b")
    assert shell.read_file("/task/id", session_id="on-b") == "B\n"
    # the layers both images have are one copy in the cache
    layers = os.listdir(Path(images["cache"]) / "layers")
    assert len([n for n in layers if not n.endswith(".json")]) == 4  # busybox, bash, A, B
    assert shell.close_session("on-b")
    assert "on-b" not in shell.isolation_report()["session_images"]


def test_the_image_stays_through_a_restart_and_a_fork(
    shell: ShellService, images: dict[str, str]
) -> None:
    shell.start_session("r", image=images["b"])
    shell.run("echo mine > /task/mine", session_id="r")
    (copy,) = shell.fork_session("r")
    seen = shell.run("cat /task/id /task/mine; pwd", session_id=copy)
    assert seen.stdout == "B\nmine\n/task\n", seen
    assert shell.isolation_report()["session_images"][copy]["reference"] == images["b"]
    slow = shell.run("sleep 30", session_id="r", timeout=0.5)
    assert slow.timed_out
    after = shell.run("cat /task/id; echo $FOO", session_id="r")  # a fresh shell, same image
    assert after.stdout == "B\nb\n", after
    for session in ("r", copy):
        shell.close_session(session)


def test_concurrent_starts_share_one_pull(
    images: dict[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with ShellService(pool_size=2, timeout=20.0, image_cache=str(tmp_path / "cache")) as service:
        if not service.isolation_report()["layers"]["session_namespaces"]["active"]:
            pytest.skip("no session namespaces here")
        store = service._images.store
        pulls: list[str] = []
        pull = store.pull

        def counted(reference: str, **kwargs: Any) -> Any:  # the real pull, counted
            pulls.append(reference)
            return pull(reference, **kwargs)

        monkeypatch.setattr(store, "pull", counted)

        async def start_all() -> None:
            async with anyio.create_task_group() as group:
                for i in range(4):
                    group.start_soon(
                        functools.partial(service.astart_session, f"s{i}", image=images["b"])
                    )

        anyio.run(start_all)
        assert pulls == [images["b"]]
        # a service without an image (the host view) and sessions on one
        for i in range(4):
            assert service.run("cat /task/id; id -u", session_id=f"s{i}").stdout == "B\n0\n"
        host = service.run("test -e /task/id || echo host-view", session_id="host")
        assert host.stdout == "host-view\n", host
        service.start_session("late", image=images["b"])
        assert pulls == [images["b"]]


def test_threads_start_sessions_on_new_images(images: dict[str, str], tmp_path: Path) -> None:
    with ShellService(pool_size=2, timeout=20.0, image_cache=str(tmp_path / "cache")) as service:
        if not service.isolation_report()["layers"]["session_namespaces"]["active"]:
            pytest.skip("no session namespaces here")
        errors: list[BaseException] = []

        def start(name: str, image: str) -> None:
            try:
                service.start_session(name, image=image)
            except BaseException as exc:
                errors.append(exc)

        threads = [
            threading.Thread(target=start, args=(f"t{i}", images["ab"[i % 2]])) for i in range(4)
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        assert not errors
        for i in range(4):
            want = "A" if i % 2 == 0 else "B"
            where = "/repo" if i % 2 == 0 else "/task"
            assert service.run(f"cat {where}/id", session_id=f"t{i}").stdout == want + "\n"


def test_bad_images_are_refused_and_make_no_session(
    shell: ShellService, images: dict[str, str], tmp_path: Path
) -> None:
    with pytest.raises(ImageNotFoundError, match="does not exist"):
        shell.start_session("bad", image=f"oci:{tmp_path}/none")
    with pytest.raises(UserError, match="no /bin/bash"):
        shell.start_session("bad", image=images["nobash"])
    (tmp_path / "rootfs").mkdir()
    with pytest.raises(UserError, match="image cache"):
        shell.start_session("bad", image=f"dir:{tmp_path}/rootfs")
    with pytest.raises(UserError, match="image reference"):
        shell.start_session("bad", image=3)  # type: ignore[arg-type]
    assert not shell._python.has_session("bad")
    assert "bad" not in shell.isolation_report()["session_images"]
    # the service's own image by name: an ordinary session
    shell.start_session("same", image=images["a"])
    assert "same" not in shell.isolation_report()["session_images"]


def test_a_replica_pulls_by_reference(shell: ShellService, images: dict[str, str]) -> None:
    replica = pickle.loads(pickle.dumps(shell))  # as a Ray replica gets the service
    try:
        replica.start_session("rb", image=images["b"])
        assert replica.run("cat /task/id", session_id="rb").stdout == "B\n"
    finally:
        replica.close()


def test_a_debian_session_beside_busybox_ones(shell: ShellService, tmp_path: Path) -> None:
    if not os.path.exists(ROOTFS):
        pytest.skip(f"no Debian rootfs at {ROOTFS}: .ci/run makes it with mmdebstrap")
    from _build import oci_layout_from_rootfs

    oci_layout_from_rootfs(str(tmp_path / "debian"), ROOTFS, [task_layer()])
    shell.start_session("deb", image=f"oci:{tmp_path}/debian")
    try:
        out = shell.run(
            "head -1 /etc/os-release; python3 -c 'import pytest; print(pytest.__name__)'; pwd",
            session_id="deb",
        )
        assert out.stdout == 'PRETTY_NAME="Debian GNU/Linux 12 (bookworm)"\npytest\n/repo\n'
        # its Python tool runs its image's python3 (the service's image has none)
        py = shell.run_python("import sys, pytest; print(sys.executable)", session_id="deb")
        assert py.stdout == "/usr/bin/python3\n", py
        assert shell.run("test -e /usr/bin/python3 || echo busybox", session_id="bb").stdout == (
            "busybox\n"
        )
    finally:
        shell.close_session("deb")


def test_an_evicted_session_comes_back_on_its_image(images: dict[str, str], tmp_path: Path) -> None:
    """Its interpreter is gone (max_sessions): the next call makes a new one on its image,
    whose shell starts in that image's WorkingDir (not the service image's)."""
    with ShellService(
        pool_size=1,
        timeout=20.0,
        max_sessions=2,
        image=images["a"],
        image_cache=str(tmp_path / "cache"),
    ) as service:
        if not service.isolation_report()["layers"]["session_namespaces"]["active"]:
            pytest.skip("no session namespaces here")
        service.start_session("x", image=images["b"])
        for other in ("h1", "h2"):
            service.run("true", session_id=other)
        assert not service._python.has_session("x")
        back = service.run("cat /task/id; echo $FOO; pwd", session_id="x")
        assert back.stdout == "B\nb\n/task\n", back
        assert service.isolation_report()["session_images"]["x"]["reference"] == images["b"]


def test_a_spawn_root_is_checked() -> None:
    """The fork server takes a SPAWN's root only in its one form (a malformed one is a
    ValueError, which the server answers as an error: no session is made)."""
    from toolservices.python.runtime._rootfs import check_root

    assert check_root(None) is None
    ok = check_root({"layers": ["/c/layers/a"], "env": {"A": "1", "B": None}})
    assert ok == {"layers": ["/c/layers/a"], "env": {"A": "1", "B": None}}
    for bad in (
        [],
        {"layers": []},
        {"layers": ["relative"]},
        {"layers": ["/a"], "env": {"A=B": "x"}},
        {"layers": ["/a"], "env": {"A": 1}},
    ):
        with pytest.raises(ValueError, match="SPAWN root"):
            check_root(bad)


def test_a_malformed_root_makes_no_session(tmp_path: Path) -> None:
    """Through the real fork server: the call fails saying so, the service carries on."""
    from toolservices.errors import InfrastructureError
    from toolservices.python import PythonExecutorService
    from toolservices.python.host import SpawnRoot

    with PythonExecutorService(pool_size=1, spares=0) as python:
        python.session_roots["bad"] = SpawnRoot({"layers": ["relative"], "env": {}})
        with pytest.raises(InfrastructureError, match="SPAWN root needs layers"):
            python.execute("print(1)", session_id="bad")
        assert python.execute("print(2)", session_id="good").stdout == "2\n"


def test_forgotten_sessions_are_pruned(tmp_path: Path) -> None:
    """Sessions the executor no longer knows an image of (evicted long ago) leave the
    service's map too, so a service that never closes sessions does not grow without end."""
    from toolservices.images import Image, ImageStore
    from toolservices.shell._images import SessionImages

    images = SessionImages(ImageStore(str(tmp_path)), default=None, insecure_registries=())
    image = Image("oci:/x", "sha256:" + "0" * 64, (f"{images.layers_dir}/a",), (), "/", 0)
    live: set[str] = set()
    for i in range(200):
        images.put(f"s{i}", image, {"start_dir": None}, live)
        if i >= 150:
            live.add(f"s{i}")
    assert set(images.sessions) <= {f"s{i}" for i in range(200)}
    assert len(images.sessions) < 200 and "s199" in images.sessions
    assert images.config_json("s199") == json.dumps({"start_dir": None})
    assert images.config_json("nobody") is None and images.config_json(None) is None
