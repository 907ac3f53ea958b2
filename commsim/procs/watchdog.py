"""The watchdog of a procs run (started by procs/tree.py's Watchdog, one per run): it waits for
the launcher, its parent, to say `done` or to die, and in the second case ends the run's
process tree and removes its files (procs/tree.py says how).

Apart from tree.py, and importing only what the wait needs: a `sweep --exec` starts one per
machine, and tree.py's imports (pathlib, shutil, ctypes, subprocess, re) were most of the
watchdog's CPU; they load only when the launcher died and the run must be ended here.
"""

from __future__ import annotations

import os
import select
import signal
import sys


def watch(marks: list[str], tmp: str, paths: list[str]) -> int:
    """The watchdog's body: wait for the launcher (this process's parent) to say done or to
    die; in the second case end the run's tree and remove its files."""
    parent = os.getppid()
    for s in (signal.SIGINT, signal.SIGHUP):      # the terminal's signals are the launcher's
        signal.signal(s, signal.SIG_IGN)
    try:
        pidfd = os.pidfd_open(parent)
    except OSError:
        pidfd = None
    if os.getppid() != parent:                   # the launcher died before the pidfd opened
        pidfd = None
    said = b""
    while pidfd is not None:
        ready, _, _ = select.select([sys.stdin.buffer, pidfd], [], [])
        if sys.stdin.buffer in ready:
            chunk = os.read(sys.stdin.fileno(), 64)
            said += chunk
            if b"done" in said:
                return 0
            if not chunk and pidfd not in ready:
                # stdin closed without `done` while the launcher lives: it is going down;
                # wait for it to be gone before touching its run
                select.select([pidfd], [], [])
                break
        if pidfd in ready:
            break
    from commsim.procs.tree import end_tree, remove_leftovers, sweep_stale_tmp
    killed = end_tree(marks)
    remove_leftovers(paths, killed, tmp)
    sweep_stale_tmp(tmp)         # ranks that died with the launcher (die_with_parent)
    return 0


if __name__ == "__main__":
    _sep = sys.argv.index("--")           # TMP MARK... -- PATH...
    sys.exit(watch(sys.argv[2:_sep], sys.argv[1], sys.argv[_sep + 1:]))
