"""Adapters for the RL trainers most people use.

* :mod:`toolservices.trainers.trl`: ``trl_environment(...)``, a class for
  TRL's ``GRPOTrainer(environment_factory=...)``;
* :mod:`toolservices.trainers.verifiers`: ``ToolservicesToolset``, a verifiers
  0.4 ``vf.Toolset`` with one episode (Python and shell sessions) per rollout;
* :mod:`toolservices.trainers.verl`: ``ToolservicesTool`` (a verl
  ``BaseTool`` for its YAML tool configs) and ``ToolservicesAgentLoop``
  (registered as ``"toolservices_agent"``), one session per trajectory.

Each module imports its trainer only when it is imported itself, so
``import toolservices`` never needs any of them. Docs: ``docs/trainers.md``.
"""

from __future__ import annotations

from toolservices._lazy import lazy_attributes

_LAZY = {
    "trl_environment": "toolservices.trainers.trl",
    "TRLEnvironment": "toolservices.trainers.trl",
    "ToolservicesToolset": "toolservices.trainers.verifiers",
    "ToolservicesTool": "toolservices.trainers.verl",
    "ToolservicesAgentLoop": "toolservices.trainers.verl",
}

__getattr__ = lazy_attributes(__name__, _LAZY)

__all__ = [
    "TRLEnvironment",
    "ToolservicesAgentLoop",
    "ToolservicesToolset",
    "ToolservicesTool",
    "trl_environment",
]
