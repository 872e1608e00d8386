"""The executor at level L1 (no bubblewrap, seccomp or Landlock): fewer layers, same semantics."""

from __future__ import annotations

from pathlib import Path

from toolservices.python import PythonExecutorService, SandboxConfig, isolation_report


def MinimalConfig(**limits: int) -> SandboxConfig:
    return SandboxConfig(bwrap=False, seccomp=False, landlock=False, **limits)


def test_minimal_layers_run_sessions_and_timeouts(sid: str) -> None:
    config = MinimalConfig(memory_limit=2 << 30, open_files=128)
    with PythonExecutorService(pool_size=1, timeout=5, sandbox=config) as svc:
        assert svc.isolation_report()["level"] == "L1"
        assert svc.execute("x = 2", session_id=sid).success
        assert svc.execute("print(x * 21)", session_id=sid).stdout == "42\n"
        limits = svc.execute(
            "import resource\nprint(resource.getrlimit(resource.RLIMIT_NOFILE)[0])"
        )
        assert limits.stdout == "128\n"
        env = svc.execute("import os\nprint(sorted(os.environ))")
        assert "TOOLSERVICES_SANDBOX_STATE" not in env.stdout
        assert "MALLOC_ARENA_MAX" in env.stdout
        slow = svc.execute("while True: pass", session_id=sid, timeout=0.3)
        assert slow.timed_out and slow.restarted
        forks = svc.fork_session(sid, 2)
        assert svc.execute("print(1)", session_id=forks[1]).stdout == "1\n"
    assert isolation_report(config)["level"] == "L1"


def test_workdir_deletion_survives_hostile_trees(tmp_path: Path, sid: str) -> None:
    """Deep trees, symlinks out of the workdir and mode-000 directories (no bwrap here,
    so the session sees host paths: the symlink really points at the canary)."""
    canary = tmp_path / "canary"
    canary.mkdir()
    (canary / "keep.txt").write_text("keep")
    code = (
        "import os\n"
        f"os.symlink({str(canary)!r}, 'link_dir')\n"
        f"os.symlink({str(canary / 'keep.txt')!r}, 'link_file')\n"
        "os.makedirs('locked/inner')\n"
        "open('locked/inner/f', 'w').write('x')\n"
        "os.chmod('locked/inner', 0)\n"
        "os.chmod('locked', 0)\n"
        "path = 'deep'\n"
        "os.mkdir(path)\n"
        "os.chdir(path)\n"
        "for _ in range(1500):\n"
        "    os.mkdir('d')\n"
        "    os.chdir('d')\n"
        "os.chdir(os.environ['HOME'])\n"
        "print(os.getcwd())"
    )
    with PythonExecutorService(pool_size=1, timeout=30, sandbox=MinimalConfig()) as svc:
        result = svc.execute(code, session_id=sid)
        assert result.success, result.stderr
        workdir = Path(result.stdout.strip())
        assert workdir.is_dir()
        svc.close_session(sid)
        assert not workdir.exists()
    assert (canary / "keep.txt").read_text() == "keep"
