"""`commsim clean`: remove what killed runs of this user left in /dev/shm and the temp dir.

A launcher that ends normally, on an error, Ctrl-C, SIGTERM or SIGHUP removes its run's
directory itself; one killed with SIGKILL cannot. Every launch sweeps such leftovers first;
this verb does the same on demand (for a CI job's last step, say). Only directories of this
user whose launcher pid no longer exists are touched: /dev/shm/commsim-<pid>-*, and in the
temp dir commsim-exec-<pid>-* (a `commsim exec` run) and commsim-rt-<pid>-* (a hosted
process's libcudart file).
"""

from __future__ import annotations

import argparse


def cmd_clean(args: argparse.Namespace) -> int:
    import tempfile

    from commsim.procs import tree
    from commsim.sim import shm

    removed = [str(shm.SHM_DIR / name) for name in shm.sweep_stale()] + tree.sweep_stale_tmp()
    for path in removed:
        print(f"removed {path}")
    print(f"{len(removed)} stale run director{'y' if len(removed) == 1 else 'ies'} removed"
          if removed else f"nothing to remove: no stale commsim runs of this user in "
                          f"{shm.SHM_DIR} or {tempfile.gettempdir()}")
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    hlp = "remove what killed runs left in /dev/shm and the temp dir"
    p = sub.add_parser("clean", help=hlp, description=__doc__.split("\n\n", 1)[1].strip())
    p.set_defaults(func=cmd_clean)
