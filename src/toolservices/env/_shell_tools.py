"""Shell tools: ``bash``, ``read_file``, ``write_file`` and ``str_replace`` in the
calling episode's own shell session.

Like :func:`~toolservices.python_tool`, the tools hold no session: an
:class:`~toolservices.env.Episode` puts its shell session id into the call's
``_state`` (``"shell_session"``), so one set of tool objects serves every
episode and each episode keeps its own working directory, variables and
files. Without a session id (a plain dispatcher call) each call runs in a
fresh session that is closed afterwards.

What the model reads is plain text. A command that exits non-zero is not a
tool failure (a failing test run is information); a timeout, a missing file
or an edit that does not match exactly is, with a message saying what to do.
"""

from __future__ import annotations

import os
import shutil
import uuid
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import anyio

from toolservices._clip import clip_middle
from toolservices.errors import ToolError, ToolTimeoutError, UserError
from toolservices.tools import Tool

if TYPE_CHECKING:
    from toolservices.shell import ShellService

__all__ = [
    "SHELL_SESSION_KEY",
    "SHELL_TOOL_NAMES",
    "ShellTool",
    "bash_tool",
    "read_file_tool",
    "shell_tools",
    "str_replace_tool",
    "write_file_tool",
]

#: The ``_state`` key that carries the episode's shell session id.
SHELL_SESSION_KEY = "shell_session"
#: The names of the tools :func:`shell_tools` makes, in its order: the one list the
#: trainer adapters and the MCP server know the shell tools by.
SHELL_TOOL_NAMES = ("bash", "read_file", "write_file", "str_replace")
#: Seconds the dispatcher waits beyond the service's own limit, so that the
#: service reports the timeout: it kills the command's process tree and says so, and
#: a supervisor that does not answer gets 5 s more (``shell._config.GRACE``) before
#: the service restarts its session and says that. Both fit inside this.
TIMEOUT_GRACE = 10.0
#: Lines ``read_file`` shows when the model gives no range.
DEFAULT_VIEW_LINES = 400
#: Characters of one shown line (longer ones are cut, with a marker).
MAX_LINE_CHARS = 2000
#: Lines of context shown around a ``str_replace`` edit.
EDIT_CONTEXT = 3
#: Bytes of a command's output the model reads by default (head and tail, about 4K tokens).
MODEL_OUTPUT = 16 * 1024
#: Leading bytes that name a binary file's type (what ``read_file`` says instead of showing it).
_MAGIC = (
    (b"\x7fELF", "ELF executable or library"),
    (b"\x89PNG", "PNG image"),
    (b"\xff\xd8\xff", "JPEG image"),
    (b"GIF8", "GIF image"),
    (b"%PDF", "PDF document"),
    (b"\x1f\x8b", "gzip archive"),
    (b"PK\x03\x04", "zip archive (or jar, wheel)"),
    (b"\xca\xfe\xba\xbe", "Java class file"),
    (b"SQLite format 3", "SQLite database"),
    (b"\x00asm", "WebAssembly module"),
)


class ShellTool(Tool):
    """Base of the shell tools: runs against the episode's session of ``shell``."""

    schema_out: dict[str, Any] = {}
    accepts_state = True
    is_async = True

    def __init__(
        self,
        shell: ShellService,
        *,
        name: str,
        description: str,
        timeout: float | None = None,
    ) -> None:
        self.shell = shell
        self.name = name
        self.description = description
        limit = getattr(shell, "timeout", None) if timeout is None else _positive(timeout)
        #: the service's limit for one command of this tool (None: the service's default)
        self.command_timeout: float | None = None if timeout is None else float(timeout)
        self.timeout = float(limit) + TIMEOUT_GRACE if limit is not None else None

    def __call__(self, **kwargs: Any) -> Any:
        raise TypeError(f"tool '{self.name}' is async: use 'await tool.acall(...)'")

    async def acall(self, **kwargs: Any) -> Any:
        state = kwargs.pop("_state", None) or {}
        session = state.get(SHELL_SESSION_KEY)
        if session is not None:
            return await self.run(session, **kwargs)
        session = f"call-{uuid.uuid4().hex[:16]}"  # no episode: a session for this call only
        try:
            return await self.run(session, **kwargs)
        finally:
            with anyio.CancelScope(shield=True):
                await self.shell.aclose_session(session)

    async def run(self, session: str, **kwargs: Any) -> str:
        """The tool's work in shell session ``session``."""
        raise NotImplementedError

    async def _read_text(self, path: str, session: str) -> str:
        data = await self._read_bytes(path, session)
        return data.decode("utf-8", "replace")

    async def _read_bytes(self, path: str, session: str) -> bytes:
        try:
            data = await self.shell.aread_file(path, session_id=session, binary=True)
            return bytes(data) if not isinstance(data, str) else data.encode()
        except ToolError as exc:  # the service's ShellFileError (not imported: it is heavy)
            if getattr(exc, "reason", None) == "EFBIG":
                limit = getattr(self.shell, "max_file_size", None)
                raise ToolError(
                    f"{path} is too large for {self.name}"
                    + (f" (more than {limit} bytes)" if limit else "")
                    + f"; look at parts of it with bash, e.g. sed -n '1,200p' {path}"
                ) from exc
            raise


class BashTool(ShellTool):
    """``bash(command, timeout=None)``; see :func:`bash_tool`."""

    def __init__(
        self,
        shell: ShellService,
        *,
        name: str = "bash",
        timeout: float | None = None,
        max_output: int | None = MODEL_OUTPUT,
    ) -> None:
        if max_output is not None and (
            isinstance(max_output, bool) or not isinstance(max_output, int) or max_output < 64
        ):
            raise UserError(f"max_output must be an int >= 64 (bytes) or None, got {max_output!r}")
        super().__init__(
            shell,
            name=name,
            description=_bash_description(shell, max_output),
            timeout=timeout,
        )
        self.max_output = max_output
        limit = self.timeout - TIMEOUT_GRACE if self.timeout is not None else None
        timeout_doc = "Seconds before the command is killed"
        if limit is not None:
            timeout_doc += f" (at most {limit:g}, the default)"
        self.schema_in = {
            "type": "object",
            "properties": {
                "command": {"type": "string", "description": "The bash command to run."},
                "timeout": {
                    "type": "number",
                    "exclusiveMinimum": 0,
                    "description": timeout_doc
                    + "; give a small one for quick commands that might hang.",
                },
            },
            "required": ["command"],
        }

    async def run(self, session: str, **kwargs: Any) -> str:
        limit = self.command_timeout
        asked = kwargs.get("timeout")
        if asked is not None:
            bound = self.timeout - TIMEOUT_GRACE if self.timeout is not None else None
            if isinstance(asked, bool) or not isinstance(asked, int | float) or not asked > 0:
                raise ToolError(f"timeout must be a number of seconds > 0, got {asked!r}")
            limit = float(asked) if bound is None else min(float(asked), bound)
        result = await self.shell.arun(kwargs["command"], session_id=session, timeout=limit)
        return command_result_text(result, max_output=self.max_output)


def _bash_description(shell: ShellService, max_output: int | None) -> str:
    """What the model should know of the sandbox: network, what is on PATH, output cap."""
    sandbox = getattr(shell, "sandbox", None)
    network = getattr(sandbox, "network", "none")
    image = getattr(shell, "image", None)
    if image is not None:  # what the image's own directories hold, not the host's
        path = os.pathsep.join(
            os.path.join(layer, d.lstrip("/"))
            for layer in image.layers
            for d in image.path.split(":")
        )
    else:
        path = _SANDBOX_PATH
    found = [tool for tool in _PATH_TOOLS if shutil.which(tool, path=path)]
    text = (
        "Run one bash command in a persistent shell: the working directory, "
        "variables, aliases and files are kept between calls. Returns stdout, "
        "stderr and the exit status. stdin is closed, so do not start "
        "interactive programs (editors, pagers, a bare python). "
    )
    if network in ("host", True):
        text += "The sandbox has network access. "
    else:
        text += (
            "The sandbox has no network"
            + (
                " beyond its own 127.0.0.1 (servers you start here)"
                if network == "loopback"
                else ""
            )
            + ": installing packages (pip, npm) or fetching URLs fails. "
        )
    if found:
        text += f"On PATH: {', '.join(found)}. "
    if max_output is not None:
        text += (
            f"Long output is cut to its first and last {max_output // 2048} KiB; "
            "redirect to a file and read parts of it if you need more."
        )
    return text.strip()


#: The sandbox's PATH (the executor's fixed one) and the programs worth naming in the description.
_SANDBOX_PATH = "/usr/local/bin:/usr/bin:/bin"
_PATH_TOOLS = (
    "python3",
    "pip",
    "git",
    "gcc",
    "make",
    "java",
    "node",
    "npm",
    "go",
    "cargo",
    "rg",
    "grep",
    "sed",
    "awk",
    "curl",
)


def command_result_text(result: Mapping[str, Any], *, max_output: int | None = None) -> str:
    """What the model reads for one command; raises :class:`ToolTimeoutError` on a timeout.

    stdout, then stderr under a ``[stderr]`` line, then ``[exit status N]``
    when it is not 0 and a note when the shell had to be restarted. With
    ``max_output`` (bytes) each stream keeps its head and tail within its
    share of it (:func:`clip_middle`; a short stream leaves its room to the other).
    """
    restarted = (
        "\n[the shell was restarted: the working directory and variables were rolled back "
        "to before this command; files are kept]"
        if result.get("restarted")
        else ""
    )
    stdout, stderr = _clipped(
        str(result.get("stdout", "")), str(result.get("stderr", "")), max_output
    )
    if result.get("timed_out"):
        output = _joined(stdout, stderr)
        raise ToolTimeoutError(
            "The command timed out and was killed with everything it started"
            + (f"; its output so far:\n{output}" if output else "")
            + restarted
        )
    text = _joined(stdout, stderr)
    code = result.get("returncode", 0)
    if code:
        text += ("\n" if text and not text.endswith("\n") else "") + f"[exit status {code}]"
    if not text:
        text = "[no output]"
    return text + restarted


def _clipped(stdout: str, stderr: str, limit: int | None) -> tuple[str, str]:
    if limit is None:
        return stdout, stderr
    sizes = (
        len(stdout.encode("utf-8", "surrogatepass")),
        len(stderr.encode("utf-8", "surrogatepass")),
    )
    if sum(sizes) <= limit:
        return stdout, stderr
    half = limit // 2
    out_room = max(half, limit - sizes[1])
    return clip_middle(stdout, out_room), clip_middle(stderr, max(half, limit - sizes[0]))


def _joined(stdout: str, stderr: str) -> str:
    if not stderr:
        return stdout
    return stdout + ("\n" if stdout and not stdout.endswith("\n") else "") + "[stderr]\n" + stderr


class ReadFileTool(ShellTool):
    """``read_file(path, start_line=None, end_line=None)``; see :func:`read_file_tool`."""

    def __init__(
        self, shell: ShellService, *, name: str = "read_file", max_lines: int = DEFAULT_VIEW_LINES
    ) -> None:
        if max_lines < 1:
            raise UserError(f"max_lines must be at least 1, got {max_lines}")
        super().__init__(
            shell,
            name=name,
            description=(
                "Show a text file with line numbers (1-based), or the entries of a "
                f"directory. Without a range it shows the first {max_lines} lines; "
                "give start_line and end_line (inclusive) to see others."
            ),
        )
        self.max_lines = max_lines
        self.schema_in = {
            "type": "object",
            "properties": {
                "path": {
                    "type": "string",
                    "description": "File or directory; relative paths are in the workspace.",
                },
                "start_line": {"type": "integer", "minimum": 1, "description": "First line."},
                "end_line": {
                    "type": "integer",
                    "minimum": -1,
                    "description": "Last line (inclusive); -1 or omitted: to the end.",
                },
            },
            "required": ["path"],
        }

    async def run(self, session: str, **kwargs: Any) -> str:
        path = kwargs["path"]
        try:
            data = await self._read_bytes(path, session)
        except ToolError as exc:
            if getattr(exc, "reason", None) != "EISDIR":
                raise
            return await self._listing(path, session)
        kind = binary_kind(data)
        if kind is not None:
            return (
                f"[{path} is a binary file ({kind}, {len(data)} bytes): not shown. "
                f"Inspect it with bash, e.g. file {path}; xxd {path} | head]"
            )
        text = data.decode("utf-8", "replace")
        return self._view(path, text, kwargs.get("start_line"), kwargs.get("end_line"))

    def _view(self, path: str, text: str, start: int | None, end: int | None) -> str:
        if start is not None and start < 1 or end is not None and end < -1:
            raise ToolError(
                f"start_line must be at least 1 and end_line at least 1 (or -1 for the end), "
                f"got start_line={start}, end_line={end}; nothing shown."
            )
        lines = text.splitlines()
        total = len(lines)
        first = start if start is not None else 1
        if end is None or end == -1:
            last = total if start is not None else min(total, first + self.max_lines - 1)
        else:
            last = end
        if end not in (None, -1) and last < first:
            raise ToolError(f"end_line ({last}) is before start_line ({first}); nothing shown.")
        if total == 0:
            return f"[{path} is empty]"
        if first > total:
            raise ToolError(
                f"start_line {first} is past the end of {path} ({total} lines); nothing shown."
            )
        last = min(last, total)
        shown = _numbered(lines, first, last)
        if first > 1 or last < total:
            shown += f"\n[lines {first}-{last} of {total}; use start_line/end_line for others]"
        return shown

    async def _listing(self, path: str, session: str) -> str:
        entries = await self.shell.alist_files(path, session_id=session)
        names = sorted(f"{e.name}/" if e.kind == "dir" else e.name for e in entries)
        return "\n".join(names) if names else f"[{path} is an empty directory]"


def binary_kind(data: bytes) -> str | None:
    """What a file's bytes are when they are not text (a NUL, or mostly not UTF-8); else None."""
    for magic, kind in _MAGIC:
        if data.startswith(magic):
            return kind
    sample = data[:8192]
    if b"\x00" in sample:
        return "binary data"
    bad = sample.decode("utf-8", "replace").count("\ufffd")
    return "binary data" if bad > max(8, len(sample) // 10) else None


def _numbered(lines: list[str], first: int, last: int) -> str:
    """Lines ``first``..``last`` (1-based, inclusive), each after its number and a tab."""
    return "\n".join(
        f"{number:6}\t{_cut(line)}" for number, line in enumerate(lines[first - 1 : last], first)
    )


def _cut(line: str) -> str:
    if len(line) <= MAX_LINE_CHARS:
        return line
    return line[:MAX_LINE_CHARS] + f"... [line cut: {len(line)} characters]"


class WriteFileTool(ShellTool):
    """``write_file(path, content)``; see :func:`write_file_tool`."""

    def __init__(self, shell: ShellService, *, name: str = "write_file") -> None:
        super().__init__(
            shell,
            name=name,
            description=(
                "Create or overwrite a text file with the given content "
                "(relative paths are in the workspace)."
            ),
        )
        self.schema_in = {
            "type": "object",
            "properties": {
                "path": {"type": "string", "description": "The file to write."},
                "content": {"type": "string", "description": "The file's whole new content."},
            },
            "required": ["path", "content"],
        }

    async def run(self, session: str, **kwargs: Any) -> str:
        path, content = kwargs["path"], kwargs["content"]
        await self.shell.awrite_file(path, content, session_id=session)
        lines = content.count("\n") + (1 if content and not content.endswith("\n") else 0)
        return f"Wrote {len(content.encode())} bytes ({lines} lines) to {path}"


class StrReplaceTool(ShellTool):
    """``str_replace(path, old_str, new_str)``; see :func:`str_replace_tool`."""

    def __init__(self, shell: ShellService, *, name: str = "str_replace") -> None:
        super().__init__(
            shell,
            name=name,
            description=(
                "Edit a text file: replace old_str, which must occur exactly once in the "
                "file (same characters, whitespace and indentation), with new_str. "
                "Include enough surrounding lines in old_str to make it unique."
            ),
        )
        self.schema_in = {
            "type": "object",
            "properties": {
                "path": {"type": "string", "description": "The file to edit."},
                "old_str": {"type": "string", "description": "The exact text to replace."},
                "new_str": {"type": "string", "description": "The text to put in its place."},
            },
            "required": ["path", "old_str", "new_str"],
        }

    async def run(self, session: str, **kwargs: Any) -> str:
        path, old, new = kwargs["path"], kwargs["old_str"], kwargs["new_str"]
        if not old:
            raise ToolError(
                "old_str is empty; give the exact text to replace "
                "(use write_file to create or overwrite a whole file)."
            )
        try:
            text = await self._read_text(path, session)
        except ToolError as exc:
            reason = getattr(exc, "reason", None)
            if reason == "EISDIR":
                raise ToolError(f"{path} is a directory; {self.name} edits a file.") from exc
            if reason == "ENOENT":
                raise ToolError(
                    f"{path} does not exist; nothing was changed. {self.name} edits an "
                    "existing file: check the path (relative paths are in the workspace), "
                    "or create the file with write_file."
                ) from exc
            raise
        count = text.count(old)
        if count == 0:
            raise ToolError(
                f"old_str was not found in {path}; nothing was changed. It must match the "
                "file exactly, including whitespace and indentation: view the file and "
                "copy the text."
            )
        if count > 1:
            lines = _match_lines(text, old)
            raise ToolError(
                f"old_str occurs {count} times in {path} (at lines "
                f"{', '.join(map(str, lines))}); nothing was changed. Include more "
                "surrounding lines so that it matches exactly once."
            )
        at = text.index(old)
        edited = text[:at] + new + text[at + len(old) :]
        await self.shell.awrite_file(path, edited, session_id=session)
        first = text.count("\n", 0, at) + 1
        last = first + new.count("\n")
        lines = edited.splitlines()
        lo, hi = max(1, first - EDIT_CONTEXT), min(len(lines), last + EDIT_CONTEXT)
        return f"Edited {path}; lines {lo}-{hi} now read:\n{_numbered(lines, lo, hi)}"


def _positive(value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
        raise UserError(f"timeout must be a number of seconds > 0 or None, got {value!r}")
    return float(value)


def _match_lines(text: str, old: str) -> list[int]:
    """1-based line numbers where each (possibly overlapping) match of ``old`` starts."""
    found, start = [], text.find(old)
    while start != -1:
        found.append(text.count("\n", 0, start) + 1)
        start = text.find(old, start + 1)
    return found


def bash_tool(
    shell: ShellService,
    *,
    name: str = "bash",
    timeout: float | None = None,
    max_output: int | None = MODEL_OUTPUT,
) -> BashTool:
    """``bash(command: str, timeout: float = ...)``: one command in the episode's shell session.

    ``timeout``: seconds a command of this tool may run (default: the
    service's ``timeout``); the model may ask for less per call (its
    ``timeout`` argument), never more. The call's limit is that plus a
    grace period, so the service kills a runaway command's process tree
    and the model reads why. ``max_output``: bytes of output the model reads
    (16 KiB; head and tail kept, ``[... N bytes omitted ...]`` between;
    ``None``: what the service kept, its ``max_output`` per stream).
    """
    return BashTool(shell, name=name, timeout=timeout, max_output=max_output)


def read_file_tool(
    shell: ShellService, *, name: str = "read_file", max_lines: int = DEFAULT_VIEW_LINES
) -> ReadFileTool:
    """``read_file(path, start_line=None, end_line=None)``: a file with line numbers.

    Shows ``max_lines`` lines unless given a range; a directory shows its
    entries. ``name="view"`` gives it the name some models were trained on.
    """
    return ReadFileTool(shell, name=name, max_lines=max_lines)


def write_file_tool(shell: ShellService, *, name: str = "write_file") -> WriteFileTool:
    """``write_file(path, content)``: create or overwrite a file in the session's workspace."""
    return WriteFileTool(shell, name=name)


def str_replace_tool(shell: ShellService, *, name: str = "str_replace") -> StrReplaceTool:
    """``str_replace(path, old_str, new_str)``: an exact-match edit.

    Refuses (with a message the model can act on) when ``old_str`` occurs
    zero times or more than once; the file is then left unchanged.
    """
    return StrReplaceTool(shell, name=name)


def shell_tools(
    shell: ShellService,
    *,
    timeout: float | None = None,
    max_output: int | None = MODEL_OUTPUT,
) -> list[ShellTool]:
    """``bash``, ``read_file``, ``write_file`` and ``str_replace`` over ``shell``.

    Give them to an :class:`~toolservices.Episode` (or ``ToolEnv``, a TorchRL
    transform, a trainer adapter) and each episode gets its own shell
    session, created on first use and closed with the episode.
    ``timeout`` and ``max_output`` are ``bash``'s (see :func:`bash_tool`).
    """
    return [
        bash_tool(shell, timeout=timeout, max_output=max_output),
        read_file_tool(shell),
        write_file_tool(shell),
        str_replace_tool(shell),
    ]
