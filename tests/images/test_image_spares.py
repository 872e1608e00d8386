"""Warm spares for the other images sessions were last started on (``image_spares``).

A service on image ``a``; sessions on other images (``b``, ``c0``..``c3``), each
with a WorkingDir, an Env and a file of its own. The 2nd session on an image is
served by that image's spare (the executor's counters say so, not timing), which
stands on that image and was warmed with its configuration; beyond
``image_spares`` images the least recently used one's spare goes; ``close()``
leaves no process.
"""

from __future__ import annotations

import pickle
from collections.abc import Callable

import psutil
import pytest
from _build import bash_layer, busybox_layer, oci_layout
from test_several_images import _own_layer
from tests._wait import wait_until

from toolservices.errors import UserError
from toolservices.python.host import IMAGE_SPARES, SpawnRoot
from toolservices.shell import ShellService

BOUND = 2  # image_spares of the LRU test
OTHERS = ("b", *(f"c{i}" for i in range(BOUND)))


@pytest.fixture(scope="module")
def images(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("spares")
    base = [busybox_layer("gzip"), bash_layer("gzip")]
    oci_layout(str(root / "a"), [*base, _own_layer("repo", b"A\n")], env=("PATH=/bin", "FOO=a"))
    for name in OTHERS:
        oci_layout(
            str(root / name),
            [*base, _own_layer(f"w{name}", f"{name}\n".encode())],
            env=("PATH=/bin", f"FOO={name}"),
            workdir=f"/w{name}",
        )
    refs = {name: f"oci:{root}/{name}" for name in ("a", *OTHERS)}
    return {**refs, "cache": str(root / "cache")}


def _service(images: dict[str, str], **kwargs: int) -> ShellService:
    service = ShellService(
        pool_size=2, timeout=20.0, image=images["a"], image_cache=images["cache"], **kwargs
    )
    report = service.isolation_report()
    if not report["layers"]["session_namespaces"]["active"]:
        service.close()
        pytest.skip(f"no session namespaces here: {report['layers']['session_namespaces']}")
    return service


def _standing(service: ShellService, n: int) -> Callable[[], bool]:
    def condition() -> bool:
        return bool(service.stats()["image_spares"] == n)

    condition.__doc__ = f"{n} image spares standing"
    return condition


def test_the_next_session_on_an_image_comes_from_its_spare(images: dict[str, str]) -> None:
    with _service(images) as service:
        service.start_session("b1", image=images["b"])  # the first on b: spawned
        stats = service.stats()
        assert (stats["image_spawns"], stats["image_spares_taken"]) == (1, 0)
        wait_until(_standing(service, 1))  # b's spare, warmed after b1's call
        for n in (2, 3):  # the 2nd..nth: each takes the spare the previous one left
            service.start_session(f"b{n}", image=images["b"])
            stats = service.stats()
            assert (stats["image_spawns"], stats["image_spares_taken"]) == (1, n - 1), stats
            # on b's root, with b's Env, starting in b's WorkingDir (the spare's supervisor
            # was warmed with b's configuration, not the service's)
            res = service.run(
                "pwd; cat /wb/id; echo $FOO; test -e /repo/id || echo no-repo", session_id=f"b{n}"
            )
            assert res.stdout == "/wb\nb\nb\nno-repo\n", res
            wait_until(_standing(service, 1))
        # sessions on the service's image still come from its own spares
        assert service.run("pwd; echo $FOO", session_id="on-a").stdout == "/repo\na\n"
        assert service.stats()["image_spawns"] == 1
        assert service.isolation_report()["session_images"]["b3"]["reference"] == images["b"]


def test_the_least_recently_used_image_loses_its_spare(images: dict[str, str]) -> None:
    with _service(images, image_spares=BOUND) as service:
        for k, name in enumerate(OTHERS):  # one image more than the bound
            service.start_session(f"first-{name}", image=images[name])
            wait_until(_standing(service, min(k + 1, BOUND)))
        assert service.stats()["image_spawns"] == len(OTHERS)
        # the newest images kept theirs: served by a spare
        newest = OTHERS[-1]
        service.start_session("again-new", image=images[newest])
        assert service.stats()["image_spares_taken"] == 1
        assert service.run("pwd", session_id="again-new").stdout == f"/w{newest}\n"
        # b, the least recently used, has none left: spawned (and warm again after)
        service.start_session("again-b", image=images["b"])
        stats = service.stats()
        assert (stats["image_spawns"], stats["image_spares_taken"]) == (len(OTHERS) + 1, 1)
        wait_until(_standing(service, BOUND))  # never more than the bound
        assert service.run("pwd", session_id="again-b").stdout == "/wb\n"
        copy = pickle.loads(pickle.dumps(service))  # a replica keeps the bound
        assert copy._python.image_spares == BOUND
        copy.close()


def test_close_leaves_no_process(images: dict[str, str]) -> None:
    service = _service(images)
    try:
        service.start_session("b1", image=images["b"])
        service.run("true", session_id="on-a")
        wait_until(_standing(service, 1))
        server = service._python._server
        assert server is not None and server.proc is not None
        tree = psutil.Process(server.proc.pid)
        processes = [tree, *tree.children(recursive=True)]
        assert len(processes) > 4  # the server, two sessions, the spares (and their shells)
    finally:
        service.close()
    _, alive = psutil.wait_procs(processes, timeout=10.0)
    assert [p for p in alive if p.status() != psutil.STATUS_ZOMBIE] == []


@pytest.mark.parametrize("knob", [{"spares": 0}, {"image_spares": 0}])
def test_no_image_spares_when_turned_off(images: dict[str, str], knob: dict[str, int]) -> None:
    with _service(images, **knob) as service:
        for n in (1, 2):
            service.start_session(f"b{n}", image=images["b"])
            assert service.run("pwd", session_id=f"b{n}").stdout == "/wb\n"
        stats = service.stats()
        assert (stats["image_spawns"], stats["image_spares_taken"]) == (2, 0)
        assert stats["image_spares"] == 0


@pytest.mark.parametrize("bad", [-1, True, 1.5, "4"])
def test_a_bad_image_spares_is_refused(bad: object) -> None:
    with pytest.raises(UserError, match="image_spares must be an int >= 0"):
        ShellService(pool_size=1, image_spares=bad)  # type: ignore[arg-type]
    with ShellService(pool_size=1) as default:
        assert default._python.image_spares == IMAGE_SPARES


def test_equal_roots_share_one_spare() -> None:
    one = SpawnRoot({"layers": ["/c/layers/x"], "env": {"A": "1", "B": None}})
    same = SpawnRoot({"env": {"B": None, "A": "1"}, "layers": ["/c/layers/x"]}, warmup="pass")
    other = SpawnRoot({"layers": ["/c/layers/y"], "env": {"A": "1", "B": None}})
    assert one.key == same.key != other.key


def test_an_image_whose_spare_fails_is_not_tried_after_every_call(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A root the fork server refuses (as an image whose spare cannot start would be): one
    try, one warning, then not again until a session on it is started again."""
    from toolservices.errors import InfrastructureError
    from toolservices.python import PythonExecutorService

    def tries() -> int:
        return sum("could not prepare a spare" in r.getMessage() for r in caplog.records)

    with PythonExecutorService(pool_size=1, spares=1) as python:
        python.session_roots["bad"] = SpawnRoot({"layers": ["relative"], "env": {}})
        with pytest.raises(InfrastructureError, match="SPAWN root"):
            python.execute("print(1)", session_id="bad")  # remembered as a recent image
        for _ in range(4):  # each fresh call orders the spares it lacks
            assert python.execute("print(2)").stdout == "2\n"
            wait_until(lambda: not python._refilling)
        assert tries() == 1
        assert python.stats()["image_spawns"] == 1
