"""What restoring saved ``ulimit`` values costs a command's bash, side by side.

Run: .venv/bin/python benchmarks/bench_ulimit_restore.py

A shell session saves ``ulimit -S -a`` and ``ulimit -H -a`` with its state
after each command. Reading those listings back in bash (a ``read`` loop over
a here-document: one ``read`` system call per byte) is compared with what the
supervisor sends instead: ``ulimit`` commands for the changed limits only
(none in the usual case, one here). Medians of fresh ``bash -c`` runs.
"""

from __future__ import annotations

import os
import re
import statistics
import subprocess
import time

RUNS = 300
SOFT = subprocess.run(["bash", "-c", "ulimit -S -a"], capture_output=True, text=True).stdout
HARD = subprocess.run(["bash", "-c", "ulimit -H -a"], capture_output=True, text=True).stdout
READ_LOOP = r"""__ts_limits() {
  builtin local __ts_l __ts_f
  while IFS= builtin read -r __ts_l; do
    __ts_f=${__ts_l%)*}
    builtin ulimit "${1:--S}" "-${__ts_f##*-}" "${__ts_l##* }" 2>/dev/null || :
  done
}
"""
LISTINGS = (
    READ_LOOP
    + f"__ts_limits -S <<'__ts_lim'\n{SOFT}__ts_lim\n__ts_limits -H <<'__ts_lim'\n{HARD}__ts_lim\n"
)
SOFT_STACK = re.search(r"-s\) (\S+)", SOFT)
CHANGED = f"builtin ulimit -S -s {SOFT_STACK.group(1) if SOFT_STACK else 8192} 2>/dev/null\n"


def medians_ms(scripts: list[str]) -> list[float]:
    """Each script's median, the scripts interleaved run by run (a shared machine drifts)."""
    times: list[list[float]] = [[] for _ in scripts]
    for _ in range(RUNS):
        for index, script in enumerate(scripts):
            started = time.perf_counter()
            subprocess.run(["bash", "--noprofile", "--norc", "-c", script], check=True)
            times[index].append(time.perf_counter() - started)
    return [statistics.median(t) * 1000 for t in times]


def main() -> None:
    print(f"# load average {os.getloadavg()}, {RUNS} runs each, interleaved, medians")
    nothing, listings, changed = medians_ms([":", LISTINGS, CHANGED])
    print(f"| bash -c ':'                         | {nothing:6.2f} ms |")
    print(f"| + read the listings back (old)      | {listings:6.2f} ms |")
    print(f"| + one ulimit command (now, changed) | {changed:6.2f} ms |")


if __name__ == "__main__":
    main()
