"""SandboxConfig validation, the report's shape and fallbacks, and enter_session's cost."""

from __future__ import annotations

import os
import time

import pytest

from toolservices.errors import UserError
from toolservices.python.sandbox import (
    LEVELS,
    SandboxConfig,
    SandboxUnavailableError,
    format_isolation_report,
    isolation_report,
    plan_server_launch,
    remove_tree,
)

pytestmark = pytest.mark.timeout(120)

EXPECTED_LAYERS = {
    "env_allowlist",
    "workdir",
    "rlimits",
    "process_group",
    "no_new_privs",
    "uid_drop",
    "nproc_limit",
    "session_namespaces",
    "namespaces",
    "network",
    "readonly_fs",
    "private_tmp",
    "seccomp",
    "landlock",
    "orphan_cleanup",
    "memory_cgroup",
}


def test_invalid_config_lists_every_problem() -> None:
    with pytest.raises(UserError) as info:
        SandboxConfig(
            memory_limit=-1,
            min_level="L9",
            extra_ro_paths=("relative",),
            extra_env={"BAD NAME": "x"},
            bwrap="/nonexistent/bwrap",
        )
    message = str(info.value)
    for needle in ("memory_limit", "L0, L1, L2, L3", "relative", "BAD NAME", "bwrap"):
        assert needle in message


def test_l0_needs_allow_unsafe() -> None:
    with pytest.raises(UserError, match="allow_unsafe"):
        SandboxConfig(min_level="L0")


def test_config_is_frozen_hashable_and_picklable() -> None:
    """Hashable (probe cache key) and picklable (it is sent to the fork server)."""
    import pickle

    config = SandboxConfig(extra_env={"A": "1"})
    assert hash(config) == hash(SandboxConfig(extra_env={"A": "1"}))
    with pytest.raises(TypeError):
        config.extra_env["B"] = "2"  # type: ignore[index]
    copy = pickle.loads(pickle.dumps(config))
    assert copy == config and hash(copy) == hash(config)


def test_report_lists_every_layer_with_a_reason() -> None:
    report = isolation_report(SandboxConfig(bwrap=False))
    assert set(report["layers"]) == EXPECTED_LAYERS
    assert report["level"] in LEVELS
    assert report["layers"]["namespaces"]["active"] is False
    assert "bwrap=False" in report["layers"]["namespaces"]["why"]
    for name, layer in report["layers"].items():
        assert layer["active"] or layer["why"], name
    text = format_isolation_report(report)
    assert report["level"] in text and "namespaces" in text and "OFF" in text


@pytest.mark.parametrize(("abi", "scoped"), [(3, False), (5, False), (6, True), (7, True)])
def test_report_claims_landlock_scoping_only_from_abi_6(abi: int, scoped: bool) -> None:
    """Scoping is always requested but the kernel applies it from ABI 6 on; the report,
    built from a probe's findings, must not promise it on older kernels."""
    from toolservices.python.sandbox._report import build_report

    report = build_report(
        SandboxConfig(),
        attempt_level="L2",
        probe={"landlock_abi": abi, "session": {"seccomp_mode": 2, "no_new_privs": True}},
        uid=None,
        nproc=256,
        fallbacks=[],
        skipped={},
        ro_paths=["/usr"],
        inside_base="/tmp/base",
        python="python3",
        bwrap=None,
    )
    detail = report["layers"]["landlock"]["detail"]
    assert detail.startswith(f"ABI {abi}:")
    assert ("scoped to the sandbox" in detail) is scoped
    assert ("not scoped (needs ABI >= 6)" in detail) is not scoped
    assert ("TCP bind/connect denied by Landlock" in report["layers"]["network"]["detail"]) is (
        abi >= 4
    )


def test_min_level_not_met_raises_with_reasons() -> None:
    with pytest.raises(SandboxUnavailableError, match="below"):
        plan_server_launch(SandboxConfig(bwrap=False, min_level="L3"), argv=["-c", "pass"])


def test_plan_close_removes_base_and_is_idempotent() -> None:
    plan = plan_server_launch(SandboxConfig(bwrap=False), argv=["-c", "pass"])
    assert os.path.isdir(plan.host_workdir_base)
    assert plan.env and plan.argv
    plan.close()
    plan.close()
    assert not os.path.exists(plan.host_workdir_base)


def test_enter_session_is_measured() -> None:
    """The probe's session times its own enter_session (figures: docs/benchmarks.md)."""
    report = isolation_report(SandboxConfig())
    assert report["enter_session_seconds"] is not None
    assert report["enter_session_seconds"] > 0


def test_remove_tree_is_iterative_and_never_follows_symlinks(tmp_path: os.PathLike[str]) -> None:
    victim = os.path.join(str(tmp_path), "victim")
    os.mkdir(victim)
    open(os.path.join(victim, "keep.txt"), "w").close()
    top = os.path.join(str(tmp_path), "tree")
    os.mkdir(top)
    fd = os.open(top, os.O_RDONLY | os.O_DIRECTORY)
    for _ in range(1500):  # deeper than the recursion limit
        os.mkdir("d", dir_fd=fd)
        child = os.open("d", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
        os.close(fd)
        fd = child
    os.close(fd)
    os.symlink(victim, os.path.join(top, "link"))
    os.chmod(os.path.join(top, "d"), 0)
    remove_tree(top)
    assert not os.path.exists(top)
    assert os.path.exists(os.path.join(victim, "keep.txt"))


@pytest.mark.parametrize("overrides", [{}, {"bwrap": False}], ids=["auto", "no-bwrap"])
def test_self_test_every_active_layer_holds(overrides: dict[str, object]) -> None:
    """The live self-test behind `toolservices sandbox-check --self-test`."""
    from toolservices.python import format_self_test, self_test

    result = self_test(SandboxConfig(**overrides))  # type: ignore[arg-type]
    text = format_self_test(result)
    assert result["ok"], text
    assert {c["status"] for c in result["checks"]} <= {"held", "skipped"}
    assert "held" in text


def test_broken_bwrap_falls_back_with_its_error() -> None:
    """A bwrap that cannot start (here /bin/false) is probed for real: L2, never silently."""
    report = isolation_report(SandboxConfig(bwrap="/bin/false"))
    assert report["level"] == "L2"
    assert report["fallbacks"][0]["level"] == "L3"
    assert report["layers"]["namespaces"]["active"] is False
    assert "L3 failed" in report["layers"]["namespaces"]["why"]


def test_missing_libseccomp_is_reported(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fault injection: libseccomp cannot be removed from this machine for real."""
    from toolservices.python.sandbox import _planner as _sandbox_plan
    from toolservices.python.sandbox._seccomp import SeccompUnavailable

    def unavailable(*, network: bool) -> bytes:
        raise SeccompUnavailable("pyseccomp/libseccomp not importable: injected")

    monkeypatch.setattr(_sandbox_plan, "build_filter", unavailable)
    plan = plan_server_launch(SandboxConfig(bwrap=False, min_level="L2"), argv=["-c", "pass"])
    try:
        assert plan.level == "L2"  # Landlock alone still gives L2
        seccomp = plan.report["layers"]["seccomp"]
        assert seccomp["active"] is False and "injected" in seccomp["why"]
    finally:
        plan.close()


@pytest.mark.parametrize("overrides", [{}, {"bwrap": False}], ids=["auto", "no-bwrap"])
def test_network_true_reaches_loopback(overrides: dict[str, object]) -> None:
    """network=True is a deliberate opt-out: the layer is off and loopback works."""
    import socket

    from toolservices.python.sandbox._snippets import run_snippets

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    port = listener.getsockname()[1]
    try:
        code = f"import socket; socket.create_connection(('127.0.0.1', {port}), 5); print('OK')"
        config = SandboxConfig(network=True, **overrides)  # type: ignore[arg-type]
        report, results = run_snippets(config, {"tcp": {"code": code}})
        assert report["layers"]["network"]["active"] is False
        assert "network=True" in report["layers"]["network"]["why"]
        assert "OK" in results["tcp"]["output"], results["tcp"]["output"]
    finally:
        listener.close()


def test_cpu_seconds_stops_a_busy_loop() -> None:
    """Layer rlimits (RLIMIT_CPU = 1 s): a busy loop is killed by the kernel (SIGXCPU)."""
    from toolservices.python.sandbox._snippets import run_snippets

    _, results = run_snippets(
        SandboxConfig(cpu_seconds=1), {"burn": {"code": "while True:\n    pass", "timeout": 20.0}}
    )
    burn = results["burn"]
    assert not burn["timed_out"], burn
    assert burn["status"] in (-24, -9), burn  # SIGXCPU at the soft limit, SIGKILL at the hard


def test_self_test_server_reports_timeouts_exits_and_lingering_writers() -> None:
    """The self-test's session runner: a hung snippet is cut at its deadline and marked,
    a finished one is not, and a descendant still holding the output pipe after the
    session exits delays the result by a grace period only (not the 30 s it sleeps)."""
    from toolservices.python.sandbox._snippets import run_snippets

    linger = (
        "import os, time\nprint('parent', flush=True)\n"
        "if os.fork() == 0:\n    time.sleep(30)\n    os._exit(0)\n"
    )
    started = time.monotonic()
    _, results = run_snippets(
        SandboxConfig(),
        {
            "hang": {"code": "import time\ntime.sleep(60)", "timeout": 1.0},
            "quick": {"code": "print('hi')\nraise SystemExit(3)", "timeout": 20.0},
            "linger": {"code": linger, "timeout": 20.0},
        },
        timeout=60.0,
    )
    assert results["hang"]["timed_out"] and results["hang"]["status"] == -9, results["hang"]
    quick = results["quick"]
    assert not quick["timed_out"] and quick["status"] == 3 and quick["output"] == "hi\n", quick
    lingering = results["linger"]
    assert not lingering["timed_out"] and lingering["status"] == 0, lingering
    assert lingering["output"] == "parent\n", lingering
    # Coarse: far below the 30 s the lingering grandchild sleeps (and its 20 s deadline).
    assert time.monotonic() - started < 15.0


@pytest.mark.skipif(os.geteuid() != 0, reason="L0 exists only for a root caller")
def test_l0_only_with_allow_unsafe(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fault injection: make every launch under the dedicated uid fail (as if the interpreter
    could not be made reachable); only allow_unsafe=True may then run user code as root."""
    from toolservices.python.sandbox import _planner as _sandbox_plan

    def unreachable(paths: object, uid: int) -> list[dict[str, object]]:
        return [{"ancestor": "/nonexistent-toolservices-test", "paths": []}]

    # the levels this machine reaches without the fault (no bubblewrap: from L2 down)
    reached = isolation_report(SandboxConfig())["level"]
    tried = ["L3", "L2", "L1"][["L3", "L2", "L1"].index(reached) :]
    monkeypatch.setattr(_sandbox_plan.probe_mod, "reach_groups", unreachable)
    config = SandboxConfig(tmp_size=(64 << 20) + 4096)  # a configuration no probe has cached
    with pytest.raises(SandboxUnavailableError, match="no isolation level"):
        plan_server_launch(config, argv=["-c", "pass"])
    plan = plan_server_launch(
        SandboxConfig(tmp_size=(64 << 20) + 4096, allow_unsafe=True), argv=["-c", "pass"]
    )
    try:
        assert plan.level == "L0"
        assert [f["level"] for f in plan.report["fallbacks"]] == tried
        assert "allow_unsafe" in plan.report["layers"]["uid_drop"]["why"]
    finally:
        plan.close()
