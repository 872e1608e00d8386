"""ShellService(image=...): every session's root is the image, with a private writable layer."""

from __future__ import annotations

import pickle
from collections.abc import Iterator
from pathlib import Path

import pytest
from _build import bash_layer, busybox_layer, oci_layout

from toolservices.shell import ShellService


@pytest.fixture(scope="module")
def image_shell(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ShellService]:
    root = tmp_path_factory.mktemp("session-image")
    digest = oci_layout(str(root / "oci"), [busybox_layer("gzip"), bash_layer("zstd")])
    shell = ShellService(
        pool_size=2,
        timeout=20.0,
        max_sessions=8,
        image=f"oci:{root}/oci",
        image_cache=str(root / "cache"),
    )
    try:
        report = shell.isolation_report()
        if not report["layers"]["session_namespaces"]["active"]:
            pytest.skip(f"no session namespaces here: {report['layers']['session_namespaces']}")
        assert report["image"]["digest"] == digest
        yield shell
    finally:
        shell.close()


def test_the_session_is_root_of_its_image(image_shell: ShellService) -> None:
    result = image_shell.run(
        "id -u; cat /repo/task.txt; echo fixed > /repo/task.txt && cat /repo/task.txt; "
        "cat /etc/os-release; rm /bin/true && echo rm-ok; mkdir -p /usr/lib/site && "
        "echo pkg > /usr/lib/site/m.py && echo install-ok; pwd",
        session_id="a",
    )
    assert result.returncode == 0, result
    assert result.stdout.split("\n")[:8] == [
        "0",
        "fix me",
        "fixed",
        "ID=testbox",
        "rm-ok",
        "install-ok",
        "/repo",  # the image's WorkingDir
        "",
    ], result
    assert image_shell.read_file("/repo/task.txt", session_id="a") == "fixed\n"
    image_shell.write_file("/etc/new.conf", "x=1\n", session_id="a")
    assert image_shell.run("cat /etc/new.conf", session_id="a").stdout == "x=1\n"


def test_sessions_start_in_the_working_dir_and_keep_the_workspace(
    image_shell: ShellService,
) -> None:
    image_shell.write_file("notes.txt", "rel\n", session_id="wd")  # relative: the workspace
    first = image_shell.run("pwd; cat task.txt; cat /workspace/notes.txt; cd /etc", session_id="wd")
    assert first.stdout == "/repo\nfix me\nrel\n", first
    assert image_shell.workspace("wd") == "/workspace"
    assert image_shell.run("pwd", session_id="wd").stdout == "/etc\n"  # where it left off


@pytest.mark.parametrize("workdir", ["/repo/app", "/srv", "/newtop/app"])
def test_a_working_dir_the_image_lacks(tmp_path: Path, workdir: str) -> None:
    """Made, as docker would: under a top-level directory of the image or a new one (the
    session's own /proc lets Landlock grant writes to all of its root)."""
    root = tmp_path / "oci"
    oci_layout(str(root), [busybox_layer("gzip"), bash_layer("zstd")], workdir=workdir)
    with ShellService(
        pool_size=1, image=f"oci:{root}", image_cache=str(tmp_path / "cache")
    ) as shell:
        if not shell.isolation_report()["layers"]["session_namespaces"]["active"]:
            pytest.skip("no session namespaces here")
        assert shell.run("pwd", session_id="s").stdout == workdir + "\n"


def test_image_workdir_false_starts_in_the_workspace(tmp_path: Path) -> None:
    """For a harness that writes files and runs them by relative path (the code judge)."""
    root = tmp_path / "oci"
    oci_layout(str(root), [busybox_layer("gzip"), bash_layer("zstd")], workdir="/repo")
    with ShellService(
        pool_size=1, image=f"oci:{root}", image_cache=str(tmp_path / "cache"), image_workdir=False
    ) as shell:
        if not shell.isolation_report()["layers"]["session_namespaces"]["active"]:
            pytest.skip("no session namespaces here")
        shell.write_file("main.sh", "echo ran\n", session_id="s")
        assert shell.run("pwd; bash main.sh", session_id="s").stdout == "/workspace\nran\n"
        copy = pickle.loads(pickle.dumps(shell))  # as a Ray replica gets it
        try:
            assert copy.image_workdir is False
        finally:
            copy.close()


def test_no_working_dir_means_the_workspace() -> None:
    from toolservices.images import Image
    from toolservices.shell._images import start_dir

    def image(working_dir: str) -> Image:
        return Image(
            reference="dir:/x",
            digest="dir:/x",
            layers=("/x",),
            env=(),
            working_dir=working_dir,
            size=0,
        )

    assert start_dir(None) is None
    assert start_dir(image("/")) is None and start_dir(image("")) is None
    assert start_dir(image("relative")) is None
    assert start_dir(image("/testbed")) == "/testbed"


def test_new_top_level_directories(image_shell: ShellService) -> None:
    """``mkdir /newdir`` and files in it, private to the session; ``/proc`` stays read-only."""
    made = image_shell.run(
        "mkdir /newdir && echo a > /newdir/f && cat /newdir/f; mkdir -p /opt/x/y && echo ok; "
        "touch /newfile && echo file-ok; echo 1 > /proc/self/comm || echo proc-ro",
        session_id="top1",
    )
    assert made.stdout == "a\nok\nfile-ok\nproc-ro\n", made
    image_shell.write_file("/newdir/g", "b\n", session_id="top1")
    assert image_shell.read_file("/newdir/g", session_id="top1") == "b\n"
    other = image_shell.run("ls -d /newdir /newfile 2>/dev/null; echo end", session_id="top2")
    assert other.stdout == "end\n", other


def test_the_writable_layer_is_hidden_from_the_session(image_shell: ShellService) -> None:
    found = image_shell.run(
        "for d in $(find / -xdev -maxdepth 4 -name .image-root 2>/dev/null) "
        "/sandbox/*/.image-root; do ls -A $d 2>&1; done; echo end",
        session_id="hide",
    )
    assert found.stdout.strip().endswith("end") and "upper" not in found.stdout, found


def test_a_private_dev_and_no_writes_to_proc(image_shell: ShellService) -> None:
    made = image_shell.run(
        "echo x > /dev/mine && cat /dev/mine; echo hi > /dev/null; "
        "ls /dev/fd/ > /dev/null && echo fd-ok; echo 1 > /proc/self/oom_score_adj || echo no-proc",
        session_id="d1",
    )
    assert made.stdout == "x\nfd-ok\nno-proc\n", made
    other = image_shell.run("test -e /dev/mine || test -e /opt2 || echo clean", session_id="d2")
    assert other.stdout == "clean\n", other


def test_changes_are_private_to_each_session(image_shell: ShellService) -> None:
    image_shell.run("echo mine > /repo/task.txt", session_id="p1")
    other = image_shell.run(
        "cat /repo/task.txt; test -e /bin/true && echo has-true", session_id="p2"
    )
    assert other.stdout == "fix me\nhas-true\n", other


def test_the_cache_is_untouched(image_shell: ShellService, tmp_path: Path) -> None:
    image_shell.run("rm -rf /repo /etc", session_id="wreck")
    assert image_shell.image is not None
    assert (Path(image_shell.image.layers[0]) / "repo/task.txt").read_text() == "fix me\n"


def test_start_session_on_the_image(image_shell: ShellService) -> None:
    import anyio

    from toolservices.errors import UserError

    assert image_shell.image is not None
    assert image_shell.start_session("started", image=image_shell.image.reference) == "started"
    with pytest.raises(UserError, match="exists already"):
        image_shell.start_session("started")
    with pytest.raises(UserError, match="does not exist"):  # another image: pulled, or not
        image_shell.start_session("other", image="oci:/somewhere/else")
    assert not image_shell._python.has_session("other")
    assert anyio.run(lambda: image_shell.astart_session("started-async")) == "started-async"
    assert image_shell.run("id -u", session_id="started-async").stdout == "0\n"


def test_fork_session_copies_the_writable_layer(image_shell: ShellService) -> None:
    image_shell.run(
        "echo src > /repo/task.txt; echo ws > here.txt; rm /etc/os-release; "
        "mkdir -p /usr/new && echo 1 > /usr/new/f; rm -rf /repo/sub 2>/dev/null; true",
        session_id="f",
    )
    a, b = image_shell.fork_session("f", 2)
    seen = image_shell.run(
        "cat here.txt /repo/task.txt /usr/new/f; test -e /etc/os-release || echo whiteout-kept",
        session_id=a,
    )
    assert seen.stdout == "ws\nsrc\n1\nwhiteout-kept\n", seen
    image_shell.run("echo copy-a > /repo/task.txt", session_id=a)
    assert image_shell.run("cat /repo/task.txt", session_id=b).stdout == "src\n"
    assert image_shell.run("cat /repo/task.txt", session_id="f").stdout == "src\n"


def test_an_image_root_needs_session_namespaces() -> None:
    from toolservices.errors import UserError
    from toolservices.python import SandboxConfig

    with pytest.raises(UserError, match="root_layers .* needs session_namespaces"):
        SandboxConfig(root_layers=("/cache/layers/a",), session_namespaces=False)
    with pytest.raises(UserError, match="must be absolute"):
        SandboxConfig(root_layers=("layers/a",))
    with pytest.raises(UserError, match="root_python must be an absolute path in an image"):
        SandboxConfig(root_python="/usr/bin/python3")
    with pytest.raises(UserError, match="root_python must be an absolute path in an image"):
        SandboxConfig(root_layers=("/cache/layers/a",), root_python="python3")


def test_an_image_without_bash_is_refused(tmp_path: Path) -> None:
    from _build import busybox_layer, oci_layout

    from toolservices.errors import UserError

    oci_layout(str(tmp_path / "oci"), [busybox_layer("gzip")])
    with pytest.raises(UserError, match="has no /bin/bash"):
        ShellService(image=f"oci:{tmp_path}/oci", image_cache=str(tmp_path / "cache"))


def test_image_sessions_run_commands_in_copies_of_one_live_bash(
    image_shell: ShellService,
) -> None:
    """The bash builtin reaches a session on an image from the bytes the fork server
    preloaded (a memfd: the image's root has no copy of the package), as on the host root."""
    from toolservices.shell._native import library

    if library() is None:
        pytest.skip("the package's bash builtin is not built here (no C compiler)")
    count = "for p in /proc/[0-9]*; do cat $p/comm; done 2>/dev/null | grep -cx ts-shell; "
    first = image_shell.run(f"X=1; cd /tmp; {count}echo $$", session_id="live")
    second = image_shell.run(f"echo $X; pwd; {count}echo $$", session_id="live")
    assert first.returncode == 0 and second.returncode == 0, (first, second)
    root_first, pid_first = first.stdout.split()
    x, where, root_second, pid_second = second.stdout.split()
    assert (root_first, root_second) == ("1", "1"), (first, second)  # one live root bash
    assert (x, where) == ("1", "/tmp")
    assert pid_first != pid_second  # each command its own copy
    # the builtin's memfd was closed once loaded: a command sees only its own descriptors
    fds = image_shell.run("ls /proc/self/fd", session_id="live").stdout.split()
    assert "7" not in fds, fds
