"""Running one command in a shell session (inside the session, standard library only).

Sent to the session with ``_supervisor`` (see there). Each command runs in a
bash of its own: a copy of the live bash (``_native``) or a fresh one (a
:class:`Spare`, started ahead of need by the spawner) whose script
(:data:`PRELUDE`) restores the saved state. Either runs the command with an
``EXIT`` trap that saves the new state (:data:`FUNCTIONS`), and exits:
:func:`collect` feeds its stdin (and a spare its command) and reads both
streams (head and tail kept) until ``waitpid`` says it ended, its time limit
passed or it waits for keys from a terminal.
"""

from __future__ import annotations

import os
import select
import sys
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING or not __name__.startswith("_toolservices_"):  # on the host (tests)
    from toolservices.shell import _procs
else:  # in a session: loaded just before this one (see ``_service._CODE``)
    _procs = sys.modules["_toolservices_shell_procs"]

BASH = "/bin/bash"
STATE_END = "#toolservices-state-end"

# What every command's bash defines: ``__ts_opts`` sets the shell options a state names,
# ``__ts_save`` (the EXIT trap) writes the state into the memfd on fd 4.
FUNCTIONS = r"""
__ts_opts() {
  [[ $1 == "$SHELLOPTS" && $2 == "$BASHOPTS" ]] && return  # the usual case: nothing to set
  builtin local __ts_o
  builtin local -a __ts_l
  IFS=: builtin read -r -a __ts_l <<<"$SHELLOPTS"
  for __ts_o in "${__ts_l[@]}"; do
    [[ :$1: == *":$__ts_o:"* ]] || builtin set +o "$__ts_o" 2>/dev/null
  done
  IFS=: builtin read -r -a __ts_l <<<"$1"
  for __ts_o in "${__ts_l[@]}"; do builtin set -o "$__ts_o" 2>/dev/null; done
  IFS=: builtin read -r -a __ts_l <<<"$BASHOPTS"
  for __ts_o in "${__ts_l[@]}"; do
    [[ :$2: == *":$__ts_o:"* ]] || builtin shopt -u "$__ts_o" 2>/dev/null
  done
  IFS=: builtin read -r -a __ts_l <<<"$2"
  for __ts_o in "${__ts_l[@]}"; do builtin shopt -s "$__ts_o" 2>/dev/null; done
}
__ts_save() {
  # the command's text and the dynamic variables (their values change at every command,
  # and the next command's bash has its own) are no state: unset in this exiting bash
  builtin unset -v __ts_cmd BASHPID EPOCHREALTIME EPOCHSECONDS RANDOM SRANDOM SECONDS
  builtin local __ts_so=$SHELLOPTS __ts_bo=$BASHOPTS
  builtin set +o errexit +o nounset +o xtrace +o verbose +o noclobber +o noglob +o posix 2>/dev/null
  {
    builtin declare -p
    builtin declare -f
    builtin alias -p
    builtin printf '#ts-limits -S\n'
    builtin ulimit -S -a
    builtin printf '#ts-limits -H\n'
    builtin ulimit -H -a
    builtin printf '#ts-limits end\n'
    builtin printf 'builtin cd -- %q 2>/dev/null\n' "$PWD"
    builtin printf '__ts_opts %q %q\n' "$__ts_so" "$__ts_bo"
    builtin printf '%s\n' '#toolservices-state-end'
  } >/dev/fd/4 2>/dev/null
}
"""
# The limits as ``ulimit -a`` lists them, soft and hard: ``_terminal.compact_limits`` turns
# the listings into ``ulimit`` commands for what changed. The live bash has a builtin that
# prints those commands at once (``_native``).
_LISTED_LIMITS = r"""
    builtin printf '#ts-limits -S\n'
    builtin ulimit -S -a
    builtin printf '#ts-limits -H\n'
    builtin ulimit -H -a
    builtin printf '#ts-limits end\n'
"""
assert _LISTED_LIMITS in FUNCTIONS
# Its save also answers first (``__ts_serve done``: the supervisor replies while the state is
# saved) and saves nothing when the state's fingerprint is the one the copy came from
# (``same``); else the text starts with its fingerprint (``fp``, see :data:`SAME`).
_SAVE = "__ts_save() {\n"
_PRINT = "  {\n    builtin declare -p\n"
assert _SAVE in FUNCTIONS and _PRINT in FUNCTIONS
LIVE_FUNCTIONS: str = (
    FUNCTIONS.replace(_SAVE, _SAVE + '  builtin __ts_serve done "$?"\n')
    .replace(
        _PRINT,
        "  builtin __ts_serve same && builtin return\n"
        + _PRINT.replace("declare -p", "__ts_serve fp\n    builtin declare -p"),
    )
    .replace(_LISTED_LIMITS, "\n    builtin __ts_serve limits\n")
)
#: what a live bash's copy saves when its state is the one it came from
SAME = b"#ts-same\n"
_FP = "#ts-fp "


def fingerprint(state: str) -> int:
    """The fingerprint a live bash's copy put first in the state it saved (0: none)."""
    if not state.startswith(_FP):
        return 0
    try:
        return int(state[len(_FP) : state.index("\n")], 16)
    except ValueError:
        return 0


# The script of a bash started ahead of need as a spare (the spawner's; the path without
# the live bash, see ``_native``): wait for a line on the pipe on fd 3 (the state is
# ready), restore the state from the memfd on fd 5, then wait for the command (the rest of
# the pipe, read to its end) and run it with an EXIT trap that saves the new state into
# the memfd on fd 4. The state is restored before the command arrives: the supervisor
# fills fd 5 as soon as the previous command ended.
PRELUDE = (
    FUNCTIONS
    + r"""
builtin shopt -s expand_aliases  # as in an interactive terminal (the state may turn it off)
builtin read -r __ts_cmd <&3 || builtin exit 1
builtin trap __ts_save EXIT
builtin source /dev/fd/5 2>/dev/null
builtin source /dev/fd/3 2>/dev/null
RANDOM=$SRANDOM
exec 3<&- 5<&-  # "builtin exec" would close them for that one command only
builtin eval "$__ts_cmd"
"""
)


def quote(text: str) -> bytes:
    """``text`` as one bash ``$'...'`` word (every byte outside printable ASCII escaped)."""
    out = bytearray(b"$'")
    for byte in text.encode("utf-8", "surrogateescape"):
        if byte < 0x20 or byte >= 0x7F or byte in (0x27, 0x5C):
            out += b"\\x%02x" % byte
        else:
            out.append(byte)
    out += b"'"
    return bytes(out)


def start_state(directory: str) -> str:
    """A shell state that only changes directory: to ``directory``, made if missing."""
    word = quote(directory).decode()
    return (
        f"builtin cd -- {word} 2>/dev/null || "
        f"{{ mkdir -p -- {word} && builtin cd -- {word}; }} 2>/dev/null\n{STATE_END}\n"
    )


class Spare:
    """A bash started ahead of need, blocked reading its state, then its command."""

    def __init__(
        self, cmd_w: int, out_r: int, err_r: int, in_w: int, state_out: int, state_in: int
    ) -> None:
        self.cmd_w, self.out_r, self.err_r, self.in_w = cmd_w, out_r, err_r, in_w
        self.state_out, self.state_in = state_out, state_in
        #: where a live bash's copy says its command ended (``collect``), or -1
        self.done_r = -1
        self.pid = 0
        #: what the poll loop writes to it besides stdin: the command, on the spawner's way
        self.writes: dict[int, bytes] = {}
        #: the generation of the shell state it was given (-1: none yet, -2: it is dead)
        self.generation = -1

    def prime(self, state: bytes, generation: int) -> None:
        """Hand it the state to restore now, before its command is known."""
        try:
            write_all(self.state_in, state)
            os.close(self.state_in)
            self.state_in = -1
            os.write(self.cmd_w, b"\n")  # one byte in a fresh pipe: never blocks
        except OSError:  # its bash is gone (a command killed it): never to be used
            self.generation = -2
            return
        self.generation = generation

    def close(self) -> None:
        fds = (self.cmd_w, self.out_r, self.err_r, self.in_w, self.state_out, self.state_in)
        for fd in (*fds, self.done_r):
            if fd >= 0:
                try:
                    os.close(fd)
                except OSError:
                    pass
        self.cmd_w = self.out_r = self.err_r = self.in_w = self.state_out = self.state_in = -1
        self.done_r = -1


def streams() -> tuple[Spare, tuple[int, int, int]]:
    """A command's streams and the memfd its bash saves the state into: the :class:`Spare`
    holding our ends (the way its bash starts sets the rest), and bash's ends (stdin,
    stdout, stderr), to hand over and then close."""
    out_r, out_w = os.pipe2(os.O_CLOEXEC)
    err_r, err_w = os.pipe2(os.O_CLOEXEC)
    in_r, in_w = os.pipe2(os.O_CLOEXEC)
    state_out = os.memfd_create("state-out", os.MFD_CLOEXEC)
    return Spare(-1, out_r, err_r, in_w, state_out, -1), (in_r, out_w, err_w)


def collect(
    pid: int,
    out_r: int,
    err_r: int,
    writes: dict[int, bytes],
    timeout: float,
    cap: int,
    *,
    pidfd: int,
    done_r: int = -1,
) -> tuple[int, list[tuple[bytes, int]], bool, str, bool]:
    """Feed ``writes`` (fd: data, closed once written) and read both streams until bash exits,
    or until it says on ``done_r`` that the command ended (a live bash's copy, see ``_native``).

    Not until EOF: background jobs may hold the streams open. The first item
    is a wait status (one made of the status ``done_r`` told); the fourth
    names a program of the command found waiting for terminal input (then the
    command was killed), or is empty; the last says the status came from
    ``done_r``: bash is still saving the state (``pidfd`` tells when it exits).
    """
    bufs = [[bytearray(), bytearray()], [bytearray(), bytearray()]]
    totals = [0, 0]
    fds = {out_r: 0, err_r: 1}
    pending: dict[int, memoryview] = {}
    poller = select.poll()
    for fd in fds:
        os.set_blocking(fd, False)
        poller.register(fd, select.POLLIN)
    for fd, data in writes.items():
        if data:
            os.set_blocking(fd, False)
            pending[fd] = memoryview(data)
            poller.register(fd, select.POLLOUT)
        else:
            os.close(fd)  # end of file at once: stdin without input
    deadline = time.monotonic() + timeout
    status: int | None = None
    timed_out = False
    stuck = ""
    pipes = {os.fstat(fd).st_ino for fd in fds}
    # pidfd: wake up when bash exits, not only when it writes.
    poller.register(pidfd, select.POLLIN)
    if done_r >= 0:
        poller.register(done_r, select.POLLIN)
    answered = False
    try:
        while status is None:
            left = deadline - time.monotonic()
            if left <= 0:
                timed_out = True
                _procs.killpg(pid)
                _, status = os.waitpid(pid, 0)
                break
            events = poller.poll(min(left, 1.0) * 1000)
            if not events and not pending:  # a quiet second: waiting for keys?
                stuck = _procs.waits_for_terminal(pid, pipes)
                if stuck:
                    _procs.killpg(pid)
                    _, status = os.waitpid(pid, 0)
                    break
            for fd, _events in events:
                if fd == done_r:
                    told = _told(done_r)
                    poller.unregister(done_r)
                    if told is not None and status is None:  # as waitpid would say it
                        status, answered = told << 8, True
                elif fd == pidfd:
                    done, st = os.waitpid(pid, os.WNOHANG)
                    if done:  # exited too (in the same round): its own status, its state saved
                        status, answered = st, False
                elif fd in pending:
                    view = pending[fd]
                    try:
                        view = view[os.write(fd, view[:65536]) :]
                    except BlockingIOError:
                        pass
                    except OSError:  # the reader is gone (closed its stdin, exited)
                        view = view[:0]
                    pending[fd] = view
                    if not view:
                        poller.unregister(fd)
                        os.close(fd)
                        del pending[fd]
                elif fd in fds and not _drain(fd, bufs[fds[fd]], totals, fds[fd], cap):
                    poller.unregister(fd)
        for fd, index in fds.items():  # what the command wrote before it exited
            _drain(fd, bufs[index], totals, index, cap)
    finally:
        for fd in pending:
            os.close(fd)
    outs = [(_kept(bufs[0], cap), totals[0]), (_kept(bufs[1], cap), totals[1])]
    return status, outs, timed_out, stuck, answered


def _told(fd: int) -> int | None:
    """The status a copy's ``__ts_serve done`` wrote (4 bytes), or None: it closed the pipe
    without (it dies of a signal, or exec'd: only ``waitpid`` knows)."""
    try:
        data = os.read(fd, 8)
    except OSError:
        return None
    return int.from_bytes(data, "little") & 0xFF if len(data) == 4 else None


def _drain(fd: int, buf: list[bytearray], totals: list[int], index: int, cap: int) -> bool:
    """Read what is there now, keeping its head and tail (see :func:`_kept`); False at EOF."""
    while True:
        try:
            chunk = os.read(fd, 65536)
        except BlockingIOError:
            return True
        except OSError:
            return False
        if not chunk:
            return False
        totals[index] += len(chunk)
        head, tail = buf
        room = cap - cap // 2 - len(head)
        if room > 0:
            head += chunk[:room]
            chunk = chunk[room:]
        keep = cap // 2
        if chunk and keep:
            tail += chunk[-keep:]
            if len(tail) > 2 * keep:  # trimmed now and then: linear in what is read
                del tail[:-keep]


def _kept(buf: list[bytearray], cap: int) -> bytes:
    """At most ``cap`` bytes of a stream: its first ``cap - cap // 2`` and its last
    ``cap // 2`` (all of it when it was no longer); the host marks the cut between."""
    head, tail = buf
    keep = cap // 2
    return bytes(head) + (bytes(tail[-keep:]) if keep else b"")


def write_all(fd: int, data: bytes) -> None:
    """Write all of ``data`` to ``fd`` (a memfd: never blocks)."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def read_all(fd: int) -> bytes:
    os.lseek(fd, 0, os.SEEK_SET)
    chunks: list[bytes] = []
    while True:
        chunk = os.read(fd, 1 << 20)
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)
