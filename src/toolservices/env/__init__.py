"""Framework-free multi-turn tool environment."""

from toolservices.env.chat import EnvStep, ToolEnv

__all__ = ["EnvStep", "ToolEnv"]
