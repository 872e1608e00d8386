"""Framework-free multi-turn tool environments: one :class:`Episode` per
trajectory, and :class:`ToolEnv` for batches stepped in lockstep."""

from toolservices.env._python_tool import python_tool
from toolservices.env._shell_tools import (
    bash_tool,
    read_file_tool,
    shell_tools,
    str_replace_tool,
    write_file_tool,
)
from toolservices.env.chat import EnvStep, ToolEnv
from toolservices.env.episode import Episode

__all__ = [
    "EnvStep",
    "Episode",
    "ToolEnv",
    "bash_tool",
    "python_tool",
    "read_file_tool",
    "shell_tools",
    "str_replace_tool",
    "write_file_tool",
]
