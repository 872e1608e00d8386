"""Framework-free multi-turn tool environments: one :class:`Episode` per
trajectory, and :class:`ToolEnv` for batches stepped in lockstep."""

from toolservices.env._python_tool import exec_result_text, python_tool
from toolservices.env.chat import EnvStep, ToolEnv
from toolservices.env.episode import Episode

__all__ = ["EnvStep", "Episode", "ToolEnv", "exec_result_text", "python_tool"]
