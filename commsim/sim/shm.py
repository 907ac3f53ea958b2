"""Device memory of a simulated GPU backed by POSIX shared memory (/dev/shm), for process mode.

Every allocation is one segment named `<prefix>-<tag>`: the prefix is per run, so the launcher
can sweep whatever a killed rank left behind, and the tag is the allocation id, so an importer
in another process finds the segment from the handle bytes alone. A mapping outlives the
segment's name (POSIX shm_unlink semantics): the exporter unlinking at free does not pull the
bytes from under an importer that still maps them, which is also what the ledger then reports.
"""

from __future__ import annotations

import mmap
import os
import secrets
from pathlib import Path

import numpy as np

SHM_DIR = Path("/dev/shm")
PREFIX_HEAD = "commsim-"


def new_prefix() -> str:
    """A fresh per-run prefix: `commsim-<pid>-<random>` (the pid says which launcher owns it)."""
    return f"{PREFIX_HEAD}{os.getpid()}-{secrets.token_hex(4)}"


def segment_path(prefix: str, tag: str) -> Path:
    return SHM_DIR / f"{prefix}-{tag}"


def _as_array(fd: int, size: int) -> np.ndarray:
    # mmap refuses length 0; a 0-byte cudaMalloc still needs a distinct object, so map one byte
    # and hand out an empty view of it.
    mm = mmap.mmap(fd, max(size, 1))
    return np.frombuffer(mm, dtype=np.uint8)[:size]


def attach(prefix: str, tag: str, size: int) -> np.ndarray | None:
    """Map an existing segment (an import in another process); None when it no longer exists
    (its exporter freed it) or is smaller than the handle says."""
    try:
        fd = os.open(segment_path(prefix, tag), os.O_RDWR)
    except FileNotFoundError:
        return None
    try:
        if os.fstat(fd).st_size < max(size, 1):
            return None
        return _as_array(fd, size)
    finally:
        os.close(fd)   # the mapping keeps the segment alive; the fd is not needed


def exists(prefix: str, tag: str) -> bool:
    return segment_path(prefix, tag).exists()


def segments(prefix: str) -> list[Path]:
    """Every segment of a run (what a sweep would remove)."""
    return sorted(SHM_DIR.glob(f"{prefix}-*"))


def sweep(prefix: str) -> list[str]:
    """Unlink every segment of a run; returns the names removed. Safe after any failure:
    mappings held by still-living processes stay valid, only the names go."""
    removed = []
    for p in segments(prefix):
        try:
            p.unlink()
            removed.append(p.name)
        except FileNotFoundError:
            pass
    return removed


class ShmMemory:
    """MemoryProvider (commsim.sim.fabric) whose allocations are named shm segments."""

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix

    def allocate(self, size: int, tag: str) -> np.ndarray:
        path = segment_path(self.prefix, tag)
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        except OSError as e:
            # /dev/shm full or the name taken: the GPU would answer out-of-memory.
            raise MemoryError(f"shm segment {path}: {e}") from e
        try:
            os.ftruncate(fd, max(size, 1))
            return _as_array(fd, size)
        except OSError as e:
            path.unlink(missing_ok=True)
            raise MemoryError(f"shm segment {path}: {e}") from e
        finally:
            os.close(fd)

    def release(self, array: np.ndarray, tag: str) -> None:
        segment_path(self.prefix, tag).unlink(missing_ok=True)
