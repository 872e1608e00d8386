"""The languages the judge runs: per language its source file, compile and run commands,
and the host tools they need, found once on the server's ``PATH``.

A toolchain that lives outside the sandbox's read-only view (rustup's ``~/.rustup``, a
JDK under ``/opt``) is bound into it read-only (``SandboxConfig.extra_ro_paths``) and
called by its real path; the judge's isolation report lists what was bound.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass, field

__all__ = ["LANGUAGES", "PROBE", "STACK_MB", "ImageTools", "Toolchain", "discover", "java_flags"]

#: every language name of SandboxFusion's API (and so of verl's client), in its order
LANGUAGES = (
    "python",
    "cpp",
    "nodejs",
    "go",
    "go_test",
    "java",
    "php",
    "csharp",
    "bash",
    "typescript",
    "sql",
    "rust",
    "cuda",
    "lua",
    "R",
    "perl",
    "D_ut",
    "ruby",
    "scala",
    "julia",
    "pytest",
    "junit",
    "kotlin_script",
    "jest",
    "verilog",
    "python_gpu",
    "lean",
    "swift",
    "racket",
)

#: directories bubblewrap shows every session read-only (L3) and the host shows at L2
_VISIBLE = ("/usr/", "/bin/", "/sbin/", "/lib/", "/lib64/")
#: the thread-heavy runtimes: glibc sizes every thread's stack by RLIMIT_STACK, so a stack
#: limit as large as the memory limit leaves them no address space for their threads
STACK_MB = {"nodejs": 8, "java": 8, "go": 64, "go_test": 64}


@dataclass(frozen=True)
class Toolchain:
    """How one language is built and run in a session's workspace.

    ``compile``/``run`` are bash command lines; ``{src}`` is the source file, tool
    names in braces (``{gxx}``) are the resolved absolute paths. ``missing`` names
    what this server lacks (then the language answers SandboxError). ``binds``: host
    directories made visible read-only. ``identity``: what the compile cache keys on
    (the tools' real paths, sizes and modification times).
    """

    language: str
    source: str
    run: str
    compile: str | None = None
    tools: dict[str, str] = field(default_factory=dict)
    missing: tuple[str, ...] = ()
    binds: tuple[str, ...] = ()
    env: str = ""
    identity: str = ""

    def command(self, template: str, **overrides: str) -> str:
        return template.format(src=self.source, **{**self.tools, **overrides})


# language -> (source file, compile template or None, run template, tools needed)
_SPECS: dict[str, tuple[str, str | None, str, tuple[str, ...]]] = {
    "python": ("main.py", None, "{python} main.py", ("python",)),
    "pytest": ("test_main.py", None, "{python} -m pytest test_main.py", ("python", "pytest")),
    "cpp": ("main.cpp", "{gxx} -std=c++17 main.cpp -o test -lpthread", "./test", ("g++",)),
    "bash": ("main.sh", None, "{bash} main.sh", ("bash",)),
    "nodejs": ("main.js", None, "{node} main.js", ("node",)),
    "java": (
        "Main.java",
        "{javac} {javac_flags} -cp '.:*' Main.java",
        "{java} {java_flags} -cp '.:*' -ea Main",
        ("javac", "java"),
    ),
    "rust": ("main.rs", "{rustc} main.rs -o test", "./test", ("rustc",)),
    "perl": ("main.pl", None, "{perl} main.pl", ("perl",)),
    "go": ("main.go", "{go} build -o out main.go", "./out", ("go",)),
    "go_test": ("main_test.go", None, "{go} test main_test.go", ("go",)),
    "php": ("main.php", None, "{php} -f main.php", ("php",)),
    "ruby": ("main.rb", None, "{ruby} main.rb", ("ruby",)),
    "lua": ("main.lua", None, "{lua} main.lua", ("lua",)),
    "R": ("main.R", None, "{Rscript} main.R", ("Rscript",)),
    "julia": ("main.jl", None, "{julia} main.jl", ("julia",)),
    "typescript": ("main.ts", None, "{tsx} main.ts", ("tsx",)),
    "racket": ("main.rkt", None, "{racket} main.rkt", ("racket",)),
    "swift": ("main.swift", None, "{swift} main.swift", ("swift",)),
    "scala": ("main.scala", None, "{scala} main.scala", ("scala",)),
    "kotlin_script": ("main.kts", None, "{kotlinc} -script main.kts", ("kotlinc",)),
    "csharp": ("Program.cs", None, "{dotnet} run", ("dotnet",)),
    "sql": ("main.sql", None, "{sqlite3} < main.sql", ("sqlite3",)),
    "lean": ("Main.lean", None, "{lean} Main.lean", ("lean",)),
    "D_ut": ("main.d", None, "{dmd} -unittest -main -run main.d", ("dmd",)),
    "verilog": ("main.v", "{iverilog} -o out main.v", "{vvp} out", ("iverilog", "vvp")),
    "cuda": ("main.cu", "{nvcc} main.cu -o test", "./test", ("nvcc", "gpu")),
    "python_gpu": ("main.py", None, "{python} main.py", ("python", "gpu")),
    "junit": ("Main.java", None, "", ("junit",)),
    "jest": ("main.test.ts", None, "", ("jest",)),
}


def java_flags(limit_mb: int) -> tuple[str, str]:
    """JVM flags that start under ``RLIMIT_AS`` (the JVM reserves far more than it uses).

    A 1/4 heap, a small class space and code cache, serial GC (few threads: the
    session's process budget counts them).
    """
    heap = max(32, limit_mb // 4)
    vm = (
        f"-Xmx{heap}m -Xss8m -XX:+UseSerialGC -XX:CompressedClassSpaceSize=64m "
        "-XX:ReservedCodeCacheSize=64m -XX:TieredStopAtLevel=1 -XX:CICompilerCount=1 "
        "-XX:-UsePerfData -Xshare:auto"
    )
    return vm, " ".join(f"-J{f}" for f in vm.split())


def _which(name: str) -> str | None:
    if name == "python":
        return sys.executable
    if name == "pytest":
        import importlib.util

        return sys.executable if importlib.util.find_spec("pytest") else None
    found = shutil.which(name)
    if found is None:
        return None
    # rustup's proxies (``~/.cargo/bin/rustc`` -> ``rustup``) choose by the name called
    return found if name == "rustc" else os.path.realpath(found)


def _rust_sysroot(rustc: str) -> str | None:
    # rustup's proxy needs its home and env; the real compiler under the sysroot does not
    try:
        out = subprocess.run(
            [rustc, "--print", "sysroot"], capture_output=True, text=True, timeout=30, check=True
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return out if os.path.isfile(os.path.join(out, "bin", "rustc")) else None


def _root(path: str) -> str:
    """The toolchain directory to bind for a tool: the parent of its ``bin``."""
    parent = os.path.dirname(path)
    return os.path.dirname(parent) if os.path.basename(parent) == "bin" else parent


def _bind_for(path: str) -> str:
    """What to show the sandbox of a tool outside its view: its toolchain directory, or
    the tool alone when that directory is a home or top-level one (``~/bin/x`` must not
    show the sandbox all of ``~``)."""
    root = _root(path)
    homes = {os.path.expanduser("~"), "/root", "/home", "/opt", "/srv", "/var", "/tmp"}
    if root in homes or root.count(os.sep) < 2 or os.path.dirname(root) == "/home":
        return path
    return root


def _outside_links(root: str) -> list[str]:
    """Directories outside the view that a toolchain's config links into (a JDK's
    ``conf/security/java.security`` -> ``/etc/java-17-openjdk``)."""
    found: list[str] = []
    conf = os.path.join(root, "conf")
    for here, _dirs, names in os.walk(conf):
        for name in names:
            path = os.path.join(here, name)
            if os.path.islink(path):
                target = os.path.realpath(path)
                if not _visible(target) and not target.startswith(root + os.sep):
                    parts = target.split(os.sep)
                    found.append(os.sep.join(parts[:3]))  # /etc/java-17-openjdk
    return found


def _visible(path: str) -> bool:
    return path.startswith(_VISIBLE) or path.startswith(sys.prefix + os.sep)


def _identity(paths: list[str]) -> str:
    h = hashlib.sha256()
    for p in sorted(paths):
        try:
            st = os.stat(p)
        except OSError:
            continue
        h.update(f"{p}\0{st.st_size}\0{st.st_mtime_ns}\0".encode())
    return h.hexdigest()[:16]


#: what no server of ours has, whatever its PATH or image
_UNAVAILABLE = {
    "gpu": "a GPU (this server runs CPU sandboxes only)",
    "junit": "the JUnit console launcher jar",
    "jest": "a jest project (node_modules)",
}


def _needed() -> tuple[str, ...]:
    """Every tool some language needs (what a probe of an image looks for)."""
    names = {n for spec in _SPECS.values() for n in spec[3] if n not in _UNAVAILABLE}
    return tuple(sorted(names | {"cc"}))


@dataclass(frozen=True)
class ImageTools:
    """The tools found inside an image by :data:`PROBE` (run in one of its sessions).

    ``paths``: tool name -> absolute path in the image; ``stamps``: tool -> its
    size and modification time there (with the image's digest, the compile cache's key).
    """

    reference: str
    digest: str
    paths: dict[str, str]
    stamps: dict[str, str]

    @classmethod
    def parse(cls, text: str, *, reference: str, digest: str) -> ImageTools:
        """Read :data:`PROBE`'s output: one ``name<TAB>path<TAB>stamp`` line per tool found."""
        paths: dict[str, str] = {}
        stamps: dict[str, str] = {}
        for line in text.splitlines():
            name, _, rest = line.partition("\t")
            path, _, stamp = rest.partition("\t")
            if name in _NEEDED and path.startswith("/"):
                paths[name] = path
                stamps[name] = stamp
        return cls(reference=reference, digest=digest, paths=paths, stamps=stamps)


_NEEDED = _needed()

#: bash run once in a session of the image: where each tool is (python: ``python3`` or
#: ``python``, which must import pytest for ``pytest``; the rest resolved through their
#: links, but rustup's proxies, which choose by the name called, and python, whose venv is
#: found from the name called), with its size and modification time
PROBE = (
    "py=$(command -v python3 || command -v python)\n"
    f"for t in {' '.join(_NEEDED)}; do\n"
    "  case $t in\n"
    "    python) p=$py ;;\n"
    '    pytest) p=; [ -n "$py" ] && "$py" -c \'import pytest\' 2>/dev/null && p=$py ;;\n'
    "    rustc) p=$(command -v rustc) ;;\n"
    '    *) p=$(command -v "$t") && q=$(readlink -f "$p" 2>/dev/null) && p=${q:-$p} ;;\n'
    "  esac\n"
    '  case $p in /*) printf \'%s\\t%s\\t%s\\n\' "$t" "$p" '
    '"$(stat -L -c \'%s:%Y\' "$p" 2>/dev/null)" ;; esac\n'
    "done\n"
    "exit 0\n"
)


def _host_tool(name: str, binds: list[str]) -> str | None:
    """A tool on the server's PATH (binding it into the sandbox's view when outside it)."""
    path = _which(name)
    if name == "rustc" and path is not None:
        sysroot = _rust_sysroot(path)
        path = os.path.join(sysroot, "bin", "rustc") if sysroot else None
        if sysroot and not _visible(sysroot):
            binds.append(sysroot)
    if path is None:
        return None
    if not _visible(path):
        binds.append(_bind_for(path))
    binds += _outside_links(_root(path))
    return path


def _image_missing(name: str, image: ImageTools) -> str:
    where = f"in image {image.reference!r}"
    if name == "python":
        return f"'python3' (or 'python') {where}"
    if name == "pytest":
        return f"pytest (importable by the image's python3) {where}"
    return f"{name!r} on the PATH of image {image.reference!r}"


def discover(language: str, *, image: ImageTools | None = None) -> Toolchain:
    """The toolchain of ``language`` on this server, or in ``image`` when one is given
    (``missing`` says what is not there)."""
    source, compile_, run, needed = _SPECS[language]
    tools: dict[str, str] = {}
    missing: list[str] = []
    found: list[str] = []  # the names of ``needed`` that are there
    binds: list[str] = []
    for name in needed:
        if name in _UNAVAILABLE:
            missing.append(_UNAVAILABLE[name])
            continue
        path = _host_tool(name, binds) if image is None else image.paths.get(name)
        if path is None:
            missing.append(
                f"{name!r} on the server's PATH" if image is None else _image_missing(name, image)
            )
            continue
        tools[name.replace("+", "x").replace("-", "_")] = path
        found.append(name)
    java_vm, javac_vm = java_flags(1024)
    tools.setdefault("java_flags", java_vm)
    tools.setdefault("javac_flags", javac_vm)
    if language == "rust" and "rustc" in tools:
        if image is None and shutil.which("cc") is None:
            missing.append("'cc' (rustc's linker) on the server's PATH")
        elif image is not None and "cc" not in image.paths:
            missing.append(f"'cc' (rustc's linker) on the PATH of image {image.reference!r}")
    if image is None:
        identity = _identity([p for k, p in tools.items() if not k.endswith("_flags")])
    else:
        stamps = "".join(f"{image.paths[n]}\0{image.stamps.get(n, '')}\0" for n in found)
        identity = hashlib.sha256(f"{image.digest}\0{stamps}".encode()).hexdigest()[:16]
    return Toolchain(
        language=language,
        source=source,
        run=run,
        compile=compile_,
        tools=tools,
        missing=tuple(missing),
        binds=tuple(dict.fromkeys(binds)),
        identity=identity,
    )
