"""`commsim clean`: remove what killed process-mode runs of this user left in /dev/shm.

A launcher that ends normally, on an error, Ctrl-C, SIGTERM or SIGHUP removes its run's
directory itself; one killed with SIGKILL cannot. Every launch sweeps such leftovers first;
this verb does the same on demand (for a CI job's last step, say). Only directories of this
user whose launcher pid no longer exists are touched.
"""

from __future__ import annotations

import argparse


def cmd_clean(args: argparse.Namespace) -> int:
    from commsim.sim import shm

    removed = shm.sweep_stale()
    for name in removed:
        print(f"removed {shm.SHM_DIR / name}")
    print(f"{len(removed)} stale run director{'y' if len(removed) == 1 else 'ies'} removed"
          if removed else f"nothing to remove: no stale commsim runs of this user in {shm.SHM_DIR}")
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    hlp = "remove shared memory left in /dev/shm by process-mode runs that were killed"
    p = sub.add_parser("clean", help=hlp, description=__doc__.split("\n\n", 1)[1].strip())
    p.set_defaults(func=cmd_clean)
