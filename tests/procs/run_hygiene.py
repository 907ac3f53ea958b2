"""What a run may leave behind, as a test (or a person) checks it: shared-memory segments of
a launcher's runs, and whether a rank process still exists."""

from __future__ import annotations

from pathlib import Path

from commsim.sim import shm


def leftover_segments(launcher_pid: int) -> list[Path]:
    """Segments of every run launched by process `launcher_pid` (prefix commsim-<pid>-)."""
    return shm.segments(f"{shm.PREFIX_HEAD}{launcher_pid}")


def pid_alive(pid: int) -> bool:
    """True when `pid` exists and is not a zombie waiting to be reaped (Linux /proc)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False
