"""Whether a pid names a live process: how a sweep tells a dead run's leftovers from a live one's."""

from __future__ import annotations

import os


def pid_alive(pid: int) -> bool:
    """True while a process with `pid` exists (another user's too: kill answers EPERM)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def pid_running(pid: int) -> bool:
    """True while `pid` names a process that has not ended: a zombie (state Z in
    /proc/<pid>/stat, man 5 proc) has ended, though its pid is still taken until reaped."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False
