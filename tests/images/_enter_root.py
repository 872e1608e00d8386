"""Run a command in an image root as a session would (a child of tests/images/test_rootfs.py).

argv: JSON {"lowerdirs": [...top first], "upper": dir, "quota": bytes, "uid": int|None,
"command": str}. As root it first becomes ``uid`` (a user's own cache, owned by that user);
then a user + mount namespace where that uid is 0, a tmpfs of ``quota`` bytes for the
writable layer, and enter_image_root; then execs the image's /bin/sh.
"""

from __future__ import annotations

import json
import os
import sys

from toolservices.python.runtime._linux import check, libc, mount
from toolservices.python.runtime._rootfs import enter_image_root

_CLONE_NEWNS, _CLONE_NEWUSER = 0x00020000, 0x10000000
_MS_REC, _MS_PRIVATE = 16384, 1 << 18


def main() -> None:
    spec = json.loads(sys.argv[1])
    if spec["uid"] is not None:
        os.setgroups([])
        os.setgid(spec["uid"])
        os.setuid(spec["uid"])
        libc().prctl(4, 1, 0, 0, 0)  # PR_SET_DUMPABLE: a uid change cleared it
    uid, gid = os.getuid(), os.getgid()
    check(libc().unshare(_CLONE_NEWUSER | _CLONE_NEWNS), "unshare")
    for name, text in (("setgroups", "deny"), ("uid_map", f"0 {uid} 1"), ("gid_map", f"0 {gid} 1")):
        with open(f"/proc/self/{name}", "w") as f:
            f.write(text)
    mount("none", "/", None, _MS_REC | _MS_PRIVATE, None)
    mount("tmpfs", spec["upper"], "tmpfs", 0, f"size={spec['quota']},mode=0755")
    enter_image_root(spec["lowerdirs"], upper_base=spec["upper"])
    os.execve("/bin/sh", ["sh", "-c", spec["command"]], {"PATH": "/bin"})


if __name__ == "__main__":
    main()
