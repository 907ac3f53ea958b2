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
