"""The sandbox side: isolation settings, launch plans, the probe, the report, the self-test.

Host side (it runs in the caller's process and may import anything): it
decides how the fork server is started and reports what isolation that
gives. What the sandbox applies inside the server and the sessions lives in
:mod:`toolservices.python.runtime` (``_launch``, ``_confine``, ``_probe``).

* :class:`SandboxConfig` (``_config``): the settings;
* :func:`plan_server_launch` (``_planner``): the best level that really works
  here, as a :class:`LaunchPlan` (``_launch_plan``);
* :func:`isolation_report` / :func:`format_isolation_report` (``_isolation``,
  built by ``_report`` from a probe launch, ``_probe``);
* the seccomp filter (``_seccomp``), the live self-test (``_selftest``) and
  the snippet runner the isolation tests use (``_snippets``).
"""

from __future__ import annotations

from toolservices.errors import SandboxUnavailableError
from toolservices.python.runtime import remove_tree
from toolservices.python.sandbox._config import (
    LEVELS,
    SandboxConfig,
    check_config,
    default_config,
    fast_tmp_dir,
    image_config,
    with_network,
)
from toolservices.python.sandbox._isolation import format_isolation_report, isolation_report
from toolservices.python.sandbox._launch_plan import (
    WORKDIR_BASE_PLACEHOLDER,
    LaunchPlan,
    enter_session,
    kill_uid,
    session_state,
)
from toolservices.python.sandbox._planner import plan_server_launch
from toolservices.python.sandbox._selftest import CheckRunner, format_self_test, self_test

__all__ = [
    "LEVELS",
    "CheckRunner",
    "WORKDIR_BASE_PLACEHOLDER",
    "LaunchPlan",
    "SandboxConfig",
    "SandboxUnavailableError",
    "check_config",
    "default_config",
    "enter_session",
    "fast_tmp_dir",
    "format_isolation_report",
    "format_self_test",
    "image_config",
    "isolation_report",
    "kill_uid",
    "plan_server_launch",
    "remove_tree",
    "self_test",
    "session_state",
    "with_network",
]
