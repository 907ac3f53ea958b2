"""Pages shared, copy-on-write, between simulated buffers that hold the same bytes.

At rack scale most simulated bytes are copies of bytes that exist elsewhere already:
- every rank's input is a window of one read-only tape (commsim/scenario/reference.py), and
  staging it into a workspace (cudaMemcpy host to device) copies it once per rank;
- a multimem.st writes the same bytes into every member of a multicast object.

Here such bytes live once, in a sealed memfd (memfd_create(2) with F_SEAL_WRITE: the file
can never change again, fcntl(2) "File Sealing"), and a destination's whole pages are replaced
by a MAP_PRIVATE | MAP_FIXED mapping of the file at the matching offset (mmap(2)): a read sees
the file's bytes, the first write to a page gives that mapping a private copy of it (copy on
write), so every byte reads exactly what a copy would have left there. Only destinations in a
private anonymous allocation of `MemoryProvider` are remapped (never shared memory, which
other processes see); partial pages at either end are copied. Whenever anything does not line
up (page offsets, a source page the host wrote since sealing), or the kernel refuses a mapping
(vm.max_map_count), the bytes are copied as before: sharing saves memory, it never changes a
value.
"""

from __future__ import annotations

import bisect
import ctypes
import fcntl
import mmap
import os
import weakref
from typing import Callable

import numpy as np

PAGE = mmap.PAGESIZE
# Below this many bytes a copy is cheaper than a memfd and a mapping per destination.
SHARE_MIN = 64 * 1024
# Below this many bytes a read maps the few pages it touches rather than asking pagemap
# whether they still hold the shared bytes.
READ_MIN = 16 * 1024
_MAP_FIXED = 0x10        # <sys/mman.h>, the same on x86-64 and arm64 Linux
# memfd sealing is Linux's (3.17 on); elsewhere every write is a plain copy.
AVAILABLE = hasattr(os, "memfd_create") and hasattr(fcntl, "F_ADD_SEALS")
_SEALS = (fcntl.F_SEAL_WRITE | fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL
          if AVAILABLE else 0)

_libc = ctypes.CDLL(None, use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int,
                       ctypes.c_long)


_pagemap_fd: dict[int, int | None] = {}     # pid -> its /proc/self/pagemap (a fork has its own)


def _pagemap() -> int | None:
    # Per process: an fd opened before a fork still reads the parent's page tables.
    pid = os.getpid()
    if pid not in _pagemap_fd:
        try:
            _pagemap_fd[pid] = os.open("/proc/self/pagemap", os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            _pagemap_fd[pid] = None
    return _pagemap_fd[pid]


# Linux Documentation/admin-guide/mm/pagemap.rst: bit 63 present, bit 61 file page or shared
# anonymous, bit 56 exclusively mapped.
PRESENT, FILE_PAGE, EXCLUSIVE = np.uint64(1 << 63), np.uint64(1 << 61), np.uint64(1 << 56)


def page_flags(addr: int, nbytes: int) -> np.ndarray | None:
    """The pagemap entries of the pages spanning [addr, addr + nbytes), or None."""
    fd = _pagemap()
    if fd is None or nbytes <= 0:
        return None
    first = addr // PAGE
    pages = (addr + nbytes - 1) // PAGE - first + 1
    try:
        return np.frombuffer(os.pread(fd, 8 * pages, 8 * first), np.uint64)
    except OSError:
        return None


def _addr(a: np.ndarray) -> int:
    return a.__array_interface__["data"][0]


class Sealed:
    """`nbytes` bytes in a memfd, written once by `fill` (a writable uint8 array over the file)
    and sealed. `map_into` puts its pages behind destination pages, copy-on-write."""

    def __init__(self, nbytes: int, fill: Callable[[np.ndarray], None]):
        self.size = nbytes
        self.fd = os.memfd_create("commsim-shared", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        try:
            os.ftruncate(self.fd, max(nbytes, 1))
            w = mmap.mmap(self.fd, max(nbytes, 1), flags=mmap.MAP_SHARED)
            try:
                arr = np.frombuffer(w, np.uint8, nbytes)
                fill(arr)
                del arr
            finally:
                w.close()               # F_SEAL_WRITE needs no writable shared mapping left
            fcntl.fcntl(self.fd, fcntl.F_ADD_SEALS, _SEALS)
            # The one mapping reads go through (`MemoryProvider.canonical`), so that reading
            # a shared page never maps it again at every destination (RSS counts mappings).
            self._ro = mmap.mmap(self.fd, max(nbytes, 1), flags=mmap.MAP_SHARED, prot=mmap.PROT_READ)
        except BaseException:
            os.close(self.fd)
            raise
        self.view = np.frombuffer(self._ro, np.uint8, nbytes)
        self._closer = weakref.finalize(self, os.close, self.fd)

    def close(self) -> None:
        """Give the fd back (no more `map_into`); the file lives on in its mappings."""
        self._closer()

    def map_into(self, dst: int, offset: int, nbytes: int) -> bool:
        """Map the file's [offset, offset + nbytes) at address `dst`, private and writable;
        all three page-aligned. False when the kernel refuses (the caller copies)."""
        got = _libc.mmap(dst, nbytes, mmap.PROT_READ | mmap.PROT_WRITE,
                         mmap.MAP_PRIVATE | _MAP_FIXED, self.fd, offset)
        return got == dst


class SealedArray(Sealed):
    """Read-mostly host bytes (an input tape) kept in a sealed memfd, so that staging any page-
    aligned window of them maps pages instead of copying. `array` is a private writable view:
    a host write to it copies that page privately, and `copy_in` then copies that page too."""

    _live: dict[int, tuple[int, "weakref.ref[SealedArray]"]] = {}   # start address -> (end, self)
    _starts: list[int] = []

    def __init__(self, nbytes: int, fill: Callable[[np.ndarray], None]):
        super().__init__(nbytes, fill)
        self._map = mmap.mmap(self.fd, max(nbytes, 1), flags=mmap.MAP_PRIVATE,
                              prot=mmap.PROT_READ | mmap.PROT_WRITE)
        self.array = np.frombuffer(self._map, np.uint8, nbytes)
        start = _addr(self.array)
        SealedArray._live[start] = (start + nbytes, weakref.ref(self))
        bisect.insort(SealedArray._starts, start)
        # Forget the range before the fd closes; the mapping itself goes with its last view.
        weakref.finalize(self, SealedArray._forget, start)

    @staticmethod
    def _forget(start: int) -> None:
        SealedArray._live.pop(start, None)
        i = bisect.bisect_left(SealedArray._starts, start)
        if i < len(SealedArray._starts) and SealedArray._starts[i] == start:
            del SealedArray._starts[i]

    @classmethod
    def containing(cls, addr: int, nbytes: int) -> tuple["SealedArray", int] | None:
        """The live sealed array holding [addr, addr + nbytes), and addr's offset in it."""
        i = bisect.bisect_right(cls._starts, addr) - 1
        if i < 0:
            return None
        start = cls._starts[i]
        end, ref = cls._live[start]
        s = ref()
        if s is None or addr + nbytes > end:
            return None
        return s, addr - start


def map_pages(sealed: Sealed, offset: int, dst: np.ndarray, src: np.ndarray,
              keep: np.ndarray | None = None) -> list[tuple[int, int]]:
    """dst[:] = src, where src's bytes are the file's from `offset` on: whole pages of dst
    mapped from the file, except the pages of that span which `keep` marks False; those, the
    partial pages at either end and any range the kernel refuses to map are copied from src.
    Returns the byte ranges of dst that were mapped (page-aligned, relative to dst)."""
    d, n = _addr(dst), dst.nbytes
    lo = -d % PAGE                       # first whole page of dst, as an offset into it
    pages = max((n - lo) // PAGE, 0)
    hi = lo + pages * PAGE
    if keep is None or keep.all():
        runs = [(0, pages, True)] if pages else []
    else:       # runs of pages to map / to copy
        cuts = [0, *(np.flatnonzero(keep[1:] != keep[:-1]) + 1).tolist(), pages]
        runs = [(i, j, bool(keep[i])) for i, j in zip(cuts[:-1], cuts[1:])]
    mapped = []
    for i, j, ok in runs:
        a, b = lo + i * PAGE, lo + j * PAGE
        if ok and sealed.map_into(d + a, offset + a, b - a):
            mapped.append((a, b))
        else:
            dst[a:b] = src[a:b]
    head, tail = min(lo, n), min(hi, n)
    dst[:head] = src[:head]
    dst[tail:] = src[tail:]
    return mapped


def sealed_source(src: np.ndarray) -> tuple[SealedArray, int, np.ndarray] | None:
    """For a 1-D uint8 `src` inside a live SealedArray: the array, src's offset in it, and
    which whole pages of src (from its first page boundary) still hold the file's bytes (a
    page the host wrote since sealing is anonymous now: present, not a file page)."""
    a = _addr(src)
    hit = SealedArray.containing(a, src.nbytes)
    if hit is None:
        return None
    lo = -a % PAGE
    pages = (src.nbytes - lo) // PAGE
    flags = page_flags(a + lo, pages * PAGE) if pages > 0 else None
    if flags is None:
        return None
    return hit[0], hit[1], ((flags & PRESENT) == 0) | ((flags & FILE_PAGE) != 0)


def stamp(src: np.ndarray, page_offset: int) -> Sealed:
    """A sealed copy of `src` placed `page_offset` bytes into its first page (to line up
    with destinations that start that far into a page)."""
    def fill(a: np.ndarray) -> None:
        a[page_offset:] = src
    return Sealed(page_offset + src.nbytes, fill)


class Origins:
    """Which pages of one allocation (a private anonymous mapping at `start`) are, copy-on-
    write, pages of which sealed file: what lets a read go through the file's one mapping.
    A page written since (anonymous in pagemap) no longer counts, whatever the table says."""

    def __init__(self, start: int, size: int):
        n = (size + PAGE - 1) // PAGE
        self.start = start
        self.src = np.zeros(n, np.int32)      # 0: not shared; else an index into `sources`
        self.page = np.zeros(n, np.int32)     # the file page behind it (files < 8 TiB)
        self.sources: list[Sealed | None] = [None]
        self._live = 1

    def _pages(self, addr: int, nbytes: int) -> tuple[int, int]:
        return (addr - self.start) // PAGE, (addr + nbytes - 1 - self.start) // PAGE + 1

    def forget(self, addr: int, nbytes: int) -> None:
        p0, p1 = self._pages(addr, nbytes)
        self.src[p0:p1] = 0

    def record(self, addr: int, nbytes: int, sealed: Sealed, offset: int,
               mapped: list[tuple[int, int]]) -> None:
        """[addr, addr + nbytes) was written; the `mapped` ranges of it (relative, page-
        aligned) from the file at `offset` on."""
        self.forget(addr, nbytes)
        if not mapped:
            return
        self.sources.append(sealed)
        idx = len(self.sources) - 1
        for a, b in mapped:
            q0, q1 = self._pages(addr + a, b - a)
            self.src[q0:q1] = idx
            f0 = (offset + a) // PAGE
            self.page[q0:q1] = np.arange(f0, f0 + q1 - q0)
        if len(self.sources) > max(64, 2 * self._live):
            self._compact()

    def _compact(self) -> None:
        """Drop sources no page refers to any more (their files go with their last mapping)."""
        # Only the entries in use are read and rewritten: the tables are zero-filled lazily
        # (calloc), and a 128 MiB workspace rewritten whole would commit all of its table.
        nz = np.flatnonzero(self.src)
        ids = self.src[nz]
        used = np.unique(ids)
        remap = np.zeros(len(self.sources), np.int32)
        remap[used] = np.arange(1, len(used) + 1, dtype=np.int32)
        self.sources = [None] + [self.sources[i] for i in used]
        self.src[nz] = remap[ids]
        self._live = len(self.sources)

    def single(self, addr: int, nbytes: int) -> tuple[Sealed, int] | None:
        """(source, offset of addr in its file) when all of [addr, addr + nbytes) still reads
        one source's bytes, else None (the common answers come without a pagemap read)."""
        p0, p1 = self._pages(addr, nbytes)
        idx = int(self.src[p0])
        if not idx or (p1 - p0 > 1 and not (self.src[p0:p1] == idx).all()):
            return None
        flags = page_flags(self.start + p0 * PAGE, (p1 - p0) * PAGE)
        if flags is None or (((flags & PRESENT) != 0) & ((flags & FILE_PAGE) == 0)).any():
            return None        # a page written since
        return self.sources[idx], int(self.page[p0]) * PAGE + (addr - self.start) % PAGE

    def runs(self, addr: int, nbytes: int) -> list[tuple[int, int, Sealed | None, int]]:
        """[addr, addr + nbytes) as runs (lo, hi relative to addr, source or None, offset of
        lo in the source's file): a run with a source reads the same bytes there. One
        index is one `record` call, whose file pages follow its pages in order."""
        p0, p1 = self._pages(addr, nbytes)
        ids = self.src[p0:p1].copy()
        flags = page_flags(self.start + p0 * PAGE, (p1 - p0) * PAGE)
        if flags is None:
            return [(0, nbytes, None, 0)]
        ids[((flags & PRESENT) != 0) & ((flags & FILE_PAGE) == 0)] = 0   # written since
        bounds = [0, *(np.flatnonzero(ids[1:] != ids[:-1]) + 1).tolist(), p1 - p0]
        out = []
        for q0, q1 in zip(bounds[:-1], bounds[1:]):
            lo = max(addr, self.start + (p0 + q0) * PAGE) - addr
            hi = min(addr + nbytes, self.start + (p0 + q1) * PAGE) - addr
            idx = int(ids[q0])
            src = self.sources[idx] if idx else None
            off = int(self.page[p0 + q0]) * PAGE + (addr + lo - self.start) % PAGE if src else 0
            out.append((lo, hi, src, off))
        return out
