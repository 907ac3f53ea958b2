"""The `/dev/shm` NCCL's SHM transport creates its segments in (src/misc/shmutils.cc
ncclShmOpen, NVIDIA/nccl v2.27.3-1): the sender side creates `/dev/shm/nccl-XXXXXX`
(mkstemp + fallocate), the peer opens the same path and maps it; the last one to attach
unlinks it. The path is only meaningful in the creator's mount namespace, so a peer in a
container with its own /dev/shm finds no such file (ENOENT), and a /dev/shm without room for
the segment fails the fallocate (ENOSPC). A segment counts against the /dev/shm's size
(`limit`) with the size NCCL gives it (`SEGMENT_BYTES`), although the simulated one holds
only what the data path uses.

Two stores stand for a process's /dev/shm: `DirShm`, real files in the directory that
stands in for the process's /dev/shm (hosted ranks: `HostedRank.shm_dir`, shared by the
processes of one namespace in both run modes), and `NamespaceShm`, in-memory segments of
one run keyed by the driver's shm namespace (commsim's own backend, whose ranks are
in-process).
"""

from __future__ import annotations

import errno
import itertools
import mmap
import os
import weakref
from typing import Any, Protocol

import numpy as np


class ShmStore(Protocol):
    def create(self, size: int, counted: int = 0) -> tuple[str, np.ndarray]:
        """A new segment of `size` bytes, `counted` (default `size`) against the /dev/shm's
        size: its /dev/shm path and its bytes (OSError on failure)."""

    def attach(self, path: str, size: int) -> np.ndarray:
        """The bytes of an existing segment (OSError ENOENT when this namespace has none)."""

    def unlink(self, path: str) -> None:
        """Remove the name (the last attacher does, as NCCL's refcount)."""


_counter = itertools.count(1)

# The size of one SHM connection's segment with NCCL's default buffers, as NCCL's WARN prints
# it: "Error while creating shared memory segment /dev/shm/nccl-... (size 9637888)"
# (NVIDIA/nccl#342 under NCCL 2.7, pytorch/ci-infra#490 in 2026). How it follows from the
# buffer sizes and the channel count is UNCONFIRMED, so one size is used for every segment.
SEGMENT_BYTES = 9637888


def _no_room(used: int, size: int, limit: int | None) -> None:
    if limit and used + size > limit:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


class DirShm:
    """Segments as files in `root`, the directory standing in for this process's /dev/shm."""

    def __init__(self, root: str, limit: int | None = None) -> None:
        self.root, self.limit = root, limit

    def _file(self, path: str) -> str:
        return os.path.join(self.root, os.path.basename(path))

    def _used(self) -> int:
        """What the segments in this /dev/shm take: their files' sizes (sparse files, as
        NCCL's are until written)."""
        with os.scandir(self.root) as it:
            return sum(e.stat().st_size for e in it if e.name.startswith("nccl-"))

    def create(self, size: int, counted: int = 0) -> tuple[str, np.ndarray]:
        path = f"/dev/shm/nccl-{os.getpid():x}{next(_counter):06x}"
        _no_room(self._used() if self.limit else 0, counted or size, self.limit)
        fd = os.open(self._file(path), os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        try:
            os.ftruncate(fd, max(size, counted))
            m = mmap.mmap(fd, size)
        finally:
            os.close(fd)
        return path, np.frombuffer(m, np.uint8)

    def attach(self, path: str, size: int) -> np.ndarray:
        fd = os.open(self._file(path), os.O_RDWR | os.O_NOFOLLOW)
        try:
            m = mmap.mmap(fd, size)
        finally:
            os.close(fd)
        return np.frombuffer(m, np.uint8)

    def unlink(self, path: str) -> None:
        try:
            os.unlink(self._file(path))
        except FileNotFoundError:
            pass


# scope -> (namespace, path) -> (the segment's bytes, what it counts against the /dev/shm)
_runs: "weakref.WeakKeyDictionary[Any, dict[tuple[str, str], tuple[np.ndarray, int]]]" = weakref.WeakKeyDictionary()


class NamespaceShm:
    """In-memory segments of one run (`scope`: an object the run's processes share), per
    shm namespace."""

    def __init__(self, scope: Any, namespace: str, limit: int | None = None) -> None:
        self.segments = _runs.setdefault(scope, {})
        self.ns, self.limit = namespace, limit

    def create(self, size: int, counted: int = 0) -> tuple[str, np.ndarray]:
        used = sum(n for (ns, _), (_, n) in self.segments.items() if ns == self.ns) if self.limit else 0
        _no_room(used, counted or size, self.limit)
        path = f"/dev/shm/nccl-{next(_counter):06x}"
        buf = np.zeros(size, np.uint8)
        self.segments[(self.ns, path)] = (buf, counted or size)
        return path, buf

    def attach(self, path: str, size: int) -> np.ndarray:
        got = self.segments.get((self.ns, path))
        if got is None:
            raise OSError(errno.ENOENT, os.strerror(errno.ENOENT))
        return got[0]

    def unlink(self, path: str) -> None:
        self.segments.pop((self.ns, path), None)
