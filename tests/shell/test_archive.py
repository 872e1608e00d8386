"""put_archive / get_archive: tar streams into and out of a session, like ``docker cp``."""

from __future__ import annotations

import io
import tarfile

import anyio
import pytest

from toolservices.errors import UserError
from toolservices.shell import ShellFileError, ShellService


def _names(data: bytes) -> list[str]:
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        return sorted(tar.getnames())


def _tar(*entries: tuple[str, bytes | None, bytes, str]) -> bytes:
    """Entries: (name, data or None, type, link target)."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as tar:
        for name, data, kind, link in entries:
            info = tarfile.TarInfo(name)
            info.type = kind
            info.linkname = link
            info.mode = 0o755 if kind == tarfile.DIRTYPE else 0o644
            if data is not None:
                info.size = len(data)
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
    return out.getvalue()


REPO = _tar(
    ("repo/", None, tarfile.DIRTYPE, ""),
    ("repo/app.py", b"print('hi')\n", tarfile.REGTYPE, ""),
    ("repo/pkg/__init__.py", b"", tarfile.REGTYPE, ""),
    ("repo/latest", None, tarfile.SYMTYPE, "app.py"),
)


def test_a_repository_goes_in_with_one_call_and_comes_back(shell: ShellService, sid: str) -> None:
    assert shell.put_archive(sid, ".", REPO) == 4
    assert shell.run("(cd repo && python3 app.py && readlink latest)", session_id=sid).stdout == (
        "hi\napp.py\n"
    )
    shell.run("echo changed >> repo/app.py", session_id=sid)
    data = shell.get_archive(sid, "repo")
    names = ["repo", "repo/app.py", "repo/latest", "repo/pkg", "repo/pkg/__init__.py"]
    assert _names(data) == names
    with tarfile.open(fileobj=io.BytesIO(data)) as back:
        assert back.getmember("repo/latest").issym()
        app = back.extractfile("repo/app.py")
        assert app is not None and app.read() == b"print('hi')\nchanged\n"
    assert _names(shell.get_archive(sid, "repo/app.py")) == ["app.py"]


def test_a_file_object_and_the_async_twins(shell: ShellService, sid: str) -> None:
    async def go() -> bytes:
        await shell.aput_archive(sid, "sub/dir", io.BytesIO(REPO))
        return await shell.aget_archive(sid, "sub/dir/repo/pkg")

    data = anyio.run(go)
    assert _names(data) == ["pkg", "pkg/__init__.py"]


def _tmp(shell: ShellService, sid: str) -> str:
    """What the session's /tmp holds (HOME, and mount points of the sandbox's view)."""
    return shell.run("ls -A /tmp", session_id=sid).stdout


@pytest.mark.parametrize(
    "archive",
    [
        _tar(("ok.txt", b"1", tarfile.REGTYPE, ""), ("../escape", b"x", tarfile.REGTYPE, "")),
        _tar(("out", None, tarfile.SYMTYPE, "/tmp"), ("out/escape", b"x", tarfile.REGTYPE, "")),
        _tar(("h", None, tarfile.LNKTYPE, "/etc/passwd")),
        _tar(("up", None, tarfile.SYMTYPE, "../../..")),
    ],
    ids=["dotdot", "through-symlink", "hardlink-out", "symlink-out"],
)
def test_escaping_archives_write_nothing(shell: ShellService, sid: str, archive: bytes) -> None:
    before = _tmp(shell, sid)
    with pytest.raises(ShellFileError, match="refused, nothing written") as info:
        shell.put_archive(sid, "dest", archive)
    assert info.value.reason == "EPERM"
    assert _tmp(shell, sid) == before
    listing = shell.run("test -e dest || test -e ../escape || echo clean", session_id=sid)
    assert listing.stdout == "clean\n", listing


def test_absolute_names_land_inside_the_destination(shell: ShellService, sid: str) -> None:
    before = _tmp(shell, sid)
    shell.put_archive(sid, "dest", _tar(("/tmp/abs", b"x", tarfile.REGTYPE, "")))
    assert shell.run("cat dest/tmp/abs", session_id=sid).stdout == "x"
    assert _tmp(shell, sid) == before


def test_a_link_already_in_the_session_is_not_followed_out(shell: ShellService, sid: str) -> None:
    shell.run("mkdir -p /tmp/outside && ln -s /tmp/outside planted", session_id=sid)
    with pytest.raises(ShellFileError, match="refused"):
        shell.put_archive(sid, ".", _tar(("planted/x", b"x", tarfile.REGTYPE, "")))
    assert shell.run("ls -A /tmp/outside", session_id=sid).stdout == ""


def test_caps_and_bad_input(sid: str) -> None:
    with ShellService(pool_size=1, max_file_size=4096, max_sessions=4) as small:
        big = _tar(("big", b"x" * 8192, tarfile.REGTYPE, ""))
        with pytest.raises(ShellFileError, match="exceeds 4096") as info:
            small.put_archive(sid, ".", big)
        assert info.value.reason == "EFBIG"
        small.run("head -c 8192 /dev/zero > big", session_id=sid)
        with pytest.raises(ShellFileError, match="exceeds 4096"):
            small.get_archive(sid, "big")
        with pytest.raises(ShellFileError, match="not a readable tar"):
            small.put_archive(sid, ".", b"not a tar at all" * 10)
        with pytest.raises(ShellFileError) as missing:
            small.get_archive(sid, "nothing-here")
        assert missing.value.reason == "ENOENT"
        with pytest.raises(UserError, match="tar must be bytes"):
            small.put_archive(sid, ".", "text")  # type: ignore[arg-type]


def test_start_session_without_an_image(shell: ShellService, sid: str) -> None:
    assert shell.start_session(sid) == sid
    with pytest.raises(UserError, match="exists already"):
        shell.start_session(sid)
    with pytest.raises(UserError, match="does not exist"):  # pulled at first use: none there
        shell.start_session(sid + "x", image="oci:/an/image")
    assert not shell._python.has_session(sid + "x")
    assert shell.run("pwd", session_id=sid).stdout == shell.workspace(sid) + "\n"


def test_files_move_between_directories(shell: ShellService, sid: str) -> None:
    """rename(2) to another directory (pip's wheel builds, git): the commands' nested
    Landlock domain grants the move right, so only the session's own rules decide."""
    result = shell.run(
        "mkdir -p a/b /tmp/x/y && echo 1 > a/b/f && echo 2 > /tmp/x/y/g && "
        "python3 -c \"import os; os.rename('a/b/f', 'a/f'); os.rename('/tmp/x/y/g', '/tmp/x/g');"
        "os.link('a/f', 'a/b/h'); print('moved')\"",
        session_id=sid,
    )
    assert result.stdout == "moved\n", result
    outside = shell.run(
        "python3 -c \"import os; os.rename('a/f', '/usr/f')\" 2>&1 | tail -1", session_id=sid
    )
    assert "Errno" in outside.stdout, outside  # still only where the session may write
