"""Ending rank processes: the reaping both process launchers share (a scenario's ranks,
commsim/procs/launcher.py; a hosted program's ranks, commsim/launch/procs.py).

A rank is anything with multiprocessing.Process's `is_alive()`, `kill()` and `join(timeout)`;
a rank started with subprocess gets them from `Session`. Only a rank still alive is killed (a
pid that has exited may already name another process), every one is killed before the first
wait, so the waits overlap instead of adding up, and no wait outlives its bound.
"""

from __future__ import annotations

import os
import signal
import subprocess
from typing import Iterable, Protocol


class Rank(Protocol):
    def is_alive(self) -> bool: ...

    def kill(self) -> None: ...

    def join(self, timeout: float | None = None) -> None: ...


def reap(ranks: Iterable[Rank], timeout: float) -> None:
    """Kill every rank still alive, then wait up to `timeout` s for each."""
    ranks = list(ranks)
    for r in ranks:
        if r.is_alive():
            r.kill()
    for r in ranks:
        r.join(timeout)


class Session:
    """A rank started with subprocess.Popen(start_new_session=True), as a `Rank`: alive while
    any process of its session is, so kill() also ends the workers a rank that has exited left
    behind; join() waits for the rank like Process.join (a wait that runs out returns)."""

    def __init__(self, popen: subprocess.Popen) -> None:
        self.popen = popen

    def is_alive(self) -> bool:
        try:
            os.killpg(self.popen.pid, 0)      # signal 0: does the process group exist
        except (ProcessLookupError, PermissionError):
            return False
        return True

    def kill(self) -> None:
        try:
            os.killpg(self.popen.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass

    def join(self, timeout: float | None = None) -> None:
        try:
            self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            pass
