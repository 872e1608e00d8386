"""The isolation report: which layers sessions get with a configuration, and why not others.

Host side: :func:`isolation_report` runs the planner's probe launches (once per
configuration, then cached); :func:`format_isolation_report` renders it for
``toolservices sandbox-check``.
"""

from __future__ import annotations

import dataclasses
import json
import sys
import threading
from collections.abc import Mapping
from typing import Any

from toolservices.python.sandbox._config import LEVELS, SandboxConfig
from toolservices.python.sandbox._planner import build_plan

__all__ = ["format_isolation_report", "isolation_report"]

_report_lock = threading.Lock()
_report_cache: dict[tuple[SandboxConfig, str], dict[str, Any]] = {}


def isolation_report(
    config: SandboxConfig | None = None,
    *,
    python: str = sys.executable,
) -> dict[str, Any]:
    """Which layers a server started with ``config`` would really get, and why others are missing.

    Runs (once per configuration, then cached) the same probe launches as
    :func:`plan_server_launch`. Never raises for a low level: the level and
    the reasons are in the dict.
    """
    config = config or SandboxConfig()
    key = (config, python)
    with _report_lock:
        cached = _report_cache.get(key)
    if cached is not None:
        return _copy(cached)
    relaxed = dataclasses.replace(config, min_level=None, allow_unsafe=True)
    plan = build_plan(relaxed, python=python, argv=["-c", "pass"])
    try:
        report = plan.report
    finally:
        plan.close()
    report["min_level"] = config.min_level
    report["meets_min_level"] = config.min_level is None or (
        LEVELS.index(report["level"]) >= LEVELS.index(config.min_level)
    )
    if report["level"] == "L0" and not config.allow_unsafe:
        report["meets_min_level"] = False
    with _report_lock:
        _report_cache[key] = report
    return _copy(report)


def _copy(report: dict[str, Any]) -> dict[str, Any]:
    """A deep copy the caller may change without touching the cache."""
    copied: dict[str, Any] = json.loads(json.dumps(report))
    return copied


def format_isolation_report(report: Mapping[str, Any]) -> str:
    """Human-readable rendering of :func:`isolation_report` (``toolservices sandbox-check``)."""
    lines = [f"isolation level: {report['level']}  ({report.get('level_meaning', '')})"]
    if report.get("min_level"):
        verdict = "met" if report.get("meets_min_level") else "NOT MET"
        lines.append(f"required minimum: {report['min_level']} ({verdict})")
    lines.append(
        f"running as: uid {report.get('caller_uid')}"
        f"{' (root)' if report.get('caller_uid') == 0 else ''}; "
        f"sandbox uid {report.get('uid')}"
    )
    lines.append("")
    width = max(len(name) for name in report["layers"])
    for name, layer in report["layers"].items():
        mark = "on " if layer["active"] else "OFF"
        text = layer.get("detail") if layer["active"] else layer.get("why", "")
        lines.append(f"  [{mark}] {name.ljust(width)}  {text}")
    for fallback in report.get("fallbacks", []):
        lines.append(f"  fell back from {fallback['level']}: {fallback['error']}")
    if report.get("not_protected"):
        lines.append("")
        lines.append("not protected at this level:")
        lines.extend(f"  - {item}" for item in report["not_protected"])
    return "\n".join(lines)
