"""The `/dev/shm` NCCL's SHM transport creates its segments in (src/misc/shmutils.cc
ncclShmOpen, NVIDIA/nccl v2.27.3-1): the sender side creates `/dev/shm/nccl-XXXXXX`
(mkstemp + fallocate), the peer opens the same path and maps it; the last one to attach
unlinks it. The path is only meaningful in the creator's mount namespace, so a peer in a
container with its own /dev/shm finds no such file (ENOENT), and a /dev/shm too small for
the segment fails the fallocate (ENOSPC).

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
    def create(self, size: int) -> tuple[str, np.ndarray]:
        """A new segment of `size` bytes: its /dev/shm path and its bytes (OSError on failure)."""

    def attach(self, path: str, size: int) -> np.ndarray:
        """The bytes of an existing segment (OSError ENOENT when this namespace has none)."""

    def unlink(self, path: str) -> None:
        """Remove the name (the last attacher does, as NCCL's refcount)."""


_counter = itertools.count(1)


class DirShm:
    """Segments as files in `root`, the directory standing in for this process's /dev/shm."""

    def __init__(self, root: str, limit: int | None = None) -> None:
        self.root, self.limit = root, limit

    def _file(self, path: str) -> str:
        return os.path.join(self.root, os.path.basename(path))

    def create(self, size: int) -> tuple[str, np.ndarray]:
        path = f"/dev/shm/nccl-{os.getpid():x}{next(_counter):06x}"
        if self.limit is not None and size > self.limit:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        fd = os.open(self._file(path), os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        try:
            os.ftruncate(fd, size)
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


_runs: "weakref.WeakKeyDictionary[Any, dict[tuple[str, str], np.ndarray]]" = weakref.WeakKeyDictionary()


class NamespaceShm:
    """In-memory segments of one run (`scope`: an object the run's processes share), per
    shm namespace."""

    def __init__(self, scope: Any, namespace: str, limit: int | None = None) -> None:
        self.segments = _runs.setdefault(scope, {})
        self.ns, self.limit = namespace, limit

    def create(self, size: int) -> tuple[str, np.ndarray]:
        if self.limit is not None and size > self.limit:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        path = f"/dev/shm/nccl-{next(_counter):06x}"
        buf = self.segments[(self.ns, path)] = np.zeros(size, np.uint8)
        return path, buf

    def attach(self, path: str, size: int) -> np.ndarray:
        buf = self.segments.get((self.ns, path))
        if buf is None:
            raise OSError(errno.ENOENT, os.strerror(errno.ENOENT))
        return buf

    def unlink(self, path: str) -> None:
        self.segments.pop((self.ns, path), None)
