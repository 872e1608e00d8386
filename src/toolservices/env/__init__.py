"""Framework-free multi-turn tool environments: one :class:`Episode` per
trajectory, :class:`ToolEnv` for batches stepped in lockstep, and the
:class:`EpisodeSpec` every driver (ToolEnv, rollouts, trainer adapters)
makes its episodes from."""

from toolservices._clip import clip_middle, omitted_marker
from toolservices.env._hooks import EpisodeHook, check_hook
from toolservices.env._python_tool import PythonRender, PythonTool, exec_result_text, python_tool
from toolservices.env._shell_tools import (
    MODEL_OUTPUT,
    SHELL_TOOL_NAMES,
    ShellTool,
    bash_tool,
    read_file_tool,
    shell_tools,
    str_replace_tool,
    write_file_tool,
)
from toolservices.env._spec import EpisodeSpec, check_episode_options
from toolservices.env.chat import EnvStep, ToolEnv
from toolservices.env.episode import Episode

__all__ = [
    "MODEL_OUTPUT",
    "SHELL_TOOL_NAMES",
    "EnvStep",
    "clip_middle",
    "omitted_marker",
    "Episode",
    "EpisodeHook",
    "EpisodeSpec",
    "PythonRender",
    "PythonTool",
    "ShellTool",
    "ToolEnv",
    "bash_tool",
    "check_hook",
    "check_episode_options",
    "exec_result_text",
    "python_tool",
    "read_file_tool",
    "shell_tools",
    "str_replace_tool",
    "write_file_tool",
]
