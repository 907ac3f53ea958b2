"""Host memory behind simulated device memory (thread mode): lazy anonymous mappings whose
pages materialise on first write, the bytes written counted from /proc/self/pagemap, pages
shared copy-on-write with identical bytes elsewhere (commsim/sim/shared_pages.py), and pages
given back the moment an allocation is freed. Process mode backs allocations with POSIX
shared memory instead (commsim/sim/shm.py ShmMemory, the same interface)."""

from __future__ import annotations

import bisect
import ctypes
import mmap
import weakref

import numpy as np

from commsim.sim import shared_pages

MMAP_MIN = 1 << 20
PAGE = mmap.PAGESIZE


def _address(array: np.ndarray) -> int:
    """The address of `array`'s first byte. `array.ctypes.data` builds numpy's ctypes helper
    object each time (a microsecond, ~40 asks per generated scenario); a ctypes view of the
    buffer costs a quarter of that. Read-only or empty arrays (no writable buffer to view)
    take numpy's way."""
    try:
        return ctypes.addressof(ctypes.c_char.from_buffer(array))
    except (TypeError, ValueError, BufferError):
        return array.ctypes.data


def _page_flags(array: np.ndarray) -> np.ndarray | None:
    """The pagemap entries behind `array` when it is an anonymous mapping, else None."""
    base = array.base
    if isinstance(base, memoryview):
        base = base.obj
    if not isinstance(base, mmap.mmap) or array.nbytes == 0:
        return None
    return shared_pages.page_flags(_address(array), array.nbytes)


def written_pages(array: np.ndarray, shared: np.ndarray | None = None) -> np.ndarray | None:
    """Per page behind `array` (an anonymous mapping), whether it holds written data: present
    and either mapped exclusively (written here; an untouched page read maps the shared zero
    page, which is not exclusive and costs nothing) or a file page (copy-on-write, shared with
    identical bytes elsewhere: commsim/sim/shared_pages.py), from /proc/self/pagemap; or
    marked in `shared` (mapped from a file, not yet read). None for any other buffer."""
    v = _page_flags(array)
    if v is None:
        return None
    w = ((v & shared_pages.PRESENT) != 0) & ((v & (shared_pages.EXCLUSIVE | shared_pages.FILE_PAGE)) != 0)
    if shared is not None:
        w |= shared[:w.size]
    return w


def written_bytes(array: np.ndarray) -> int | None:
    """`written_pages(array)` counted, in bytes (None where that is None). Only present pages
    can count, and of a workspace few are (a release reads every page's entry: 33k for a
    128 MiB symmetric buffer), so the flags are tested on those alone."""
    v = _page_flags(array)
    if v is None:
        return None
    present = v[v >= shared_pages.PRESENT]        # bit 63, the highest of the entry
    return int(np.count_nonzero(present & (shared_pages.EXCLUSIVE | shared_pages.FILE_PAGE))) * PAGE


def resident_bytes(array: np.ndarray) -> int:
    """Simulated bytes written behind `array` (`written_pages`); any other buffer counts whole."""
    n = written_bytes(array)
    return int(array.nbytes) if n is None else n


class MemoryProvider:
    """Backs device memory with host bytes, committed by the OS only where touched, so a
    simulated 128 MiB workspace costs nothing until it is used: a reservation is address
    space only, an allocation is an anonymous mapping whose pages materialise on first write,
    and reads of untouched memory return zeros without allocating (the zero page).
    With `count_touched`, `touched` sums the written bytes of every allocation at its release,
    pages shared with identical bytes elsewhere included: divided into the run's peak RSS
    growth, it is the host cost per simulated byte touched. Only a caller that reports that
    figure asks for it (benchmarks/rack_scale.py): the count reads /proc/self/pagemap at every
    release (4 % of a sweep's CPU), and a provider that does not count has no `touched`."""

    def __init__(self, count_touched: bool = False) -> None:
        if count_touched:
            self.touched = 0
        self._count = count_touched
        self._starts: list[int] = []          # sorted start addresses of the mappings below
        # start -> (end, the mapping) of each anonymous mapping not yet released
        self._ends: dict[int, tuple[int, weakref.ref]] = {}
        self._shared: dict[int, shared_pages.Origins] = {}   # start -> its pages' files

    def allocate(self, size: int, tag: str) -> np.ndarray:
        # Large buffers come from an anonymous mapping: zero-filled, committed page by page on
        # touch, and cheaper to create and drop than numpy.zeros (30 % of a sweep's time).
        if size >= MMAP_MIN:
            try:
                # MAP_PRIVATE: a read of an untouched page maps the shared zero page (costs
                # nothing); mmap's default MAP_SHARED backs it with shmem, committed on read too.
                m = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
            except OSError as e:    # ENOMEM (an address-space limit): the GPU answers OOM
                raise MemoryError(str(e)) from e
            a = np.frombuffer(m, dtype=np.uint8)
            start = _address(a)
            # An allocation dropped without release left its entry: the address is new now.
            self._shared.pop(start, None)
            if start not in self._ends:
                bisect.insort(self._starts, start)
            self._ends[start] = (start + size, weakref.ref(m))
            return a
        return np.zeros(size, dtype=np.uint8)

    def release(self, array: np.ndarray, tag: str) -> None:
        start = _address(array)
        o = self._shared.pop(start, None)
        if self._count:
            self.touched += self._written(array, o)
        entry = self._ends.pop(start, None)
        if entry is not None:
            del self._starts[bisect.bisect_left(self._starts, start)]
            m = entry[1]()
            if m is not None:
                # The pages go now, not when the last view of them is collected: a peer that
                # still maps freed memory (row L15) or a kernel's view would keep them (and
                # peak RSS would follow dead memory). What a freed range holds is undefined
                # on a GPU; every access through the driver faults already.
                m.madvise(mmap.MADV_DONTNEED)

    @staticmethod
    def _written(array: np.ndarray, origins: shared_pages.Origins | None) -> int:
        """The bytes of `array` written so far (its pages shared with a sealed file included)."""
        if origins is None:
            n = written_bytes(array)
            return int(array.nbytes) if n is None else n
        w = written_pages(array, origins.src != 0)
        return int(array.nbytes) if w is None else int(np.count_nonzero(w)) * PAGE

    def _alloc_of(self, a: np.ndarray) -> int | None:
        """The start of the live private anonymous allocation of this provider that holds
        `a` (memory only this process sees, so its pages may be remapped), or None."""
        addr = _address(a)
        i = bisect.bisect_right(self._starts, addr) - 1
        if i < 0:
            return None
        end, alive = self._ends[self._starts[i]]
        # Only while its mapping lives: after that the range may be anybody's memory.
        return self._starts[i] if addr + a.nbytes <= end and alive() is not None else None

    def _origins(self, start: int) -> shared_pages.Origins:
        o = self._shared.get(start)
        if o is None:
            o = self._shared[start] = shared_pages.Origins(start, self._ends[start][0] - start)
        return o

    # -- bytes that exist elsewhere already (commsim/sim/shared_pages.py) -------------------
    def copy_in(self, dst: np.ndarray, src: np.ndarray) -> None:
        """dst[:] = src (1-D uint8): a host-to-device copy. Pages of a sealed input tape are
        mapped copy-on-write instead of copied where they line up."""
        start = (self._alloc_of(dst) if dst.nbytes >= shared_pages.SHARE_MIN
                 and shared_pages.AVAILABLE else None)
        hit = shared_pages.sealed_source(src) if start is not None else None
        if hit is None or (_address(dst) - hit[1]) % PAGE:
            np.copyto(dst, src)
            if start in self._shared:
                self._shared[start].forget(_address(dst), dst.nbytes)
            return
        sealed, offset, keep = hit
        mapped = shared_pages.map_pages(sealed, offset, dst, src, keep)
        self._origins(start).record(_address(dst), dst.nbytes, sealed, offset, mapped)

    def broadcast(self, dsts: list[np.ndarray], src: np.ndarray) -> None:
        """Every dst[:] = src (1-D uint8): a multimem.st to every member of a multicast
        object. One sealed copy of the bytes backs every member's whole pages."""
        starts = [self._alloc_of(d) for d in dsts]
        off = _address(dsts[0]) % PAGE
        if (len(dsts) < 2 or src.nbytes < shared_pages.SHARE_MIN or not shared_pages.AVAILABLE
                or None in starts
                or any(_address(d) % PAGE != off for d in dsts)):
            for d, s in zip(dsts, starts):
                np.copyto(d, src)
                if s in self._shared:
                    self._shared[s].forget(_address(d), d.nbytes)
            return
        stamp = shared_pages.stamp(src, off)
        try:
            for d, s in zip(dsts, starts):
                mapped = shared_pages.map_pages(stamp, off, d, src)
                self._origins(s).record(_address(d), d.nbytes, stamp, off, mapped)
        finally:
            stamp.close()        # mapped now; no more mappings of it are made

    def canonical(self, view: np.ndarray) -> np.ndarray | None:
        """A read-only array with the bytes of `view` (1-D uint8) read through the one mapping
        of the sealed file behind them, or None when they are not all one file's: reading it
        maps no page at `view` (RSS counts every mapping of a shared page)."""
        if view.nbytes < shared_pages.READ_MIN or not self._shared:
            return None
        start = self._alloc_of(view)
        o = self._shared.get(start) if start is not None else None
        if o is None:
            return None
        hit = o.single(_address(view), view.nbytes)
        if hit is None:
            return None
        return hit[0].view[hit[1]:hit[1] + view.nbytes]

    def read_copy(self, view: np.ndarray) -> np.ndarray:
        """view.copy() (1-D uint8), shared pages read through their file's one mapping."""
        start = self._alloc_of(view) if view.nbytes >= shared_pages.READ_MIN and self._shared else None
        o = self._shared.get(start) if start is not None else None
        if o is None:
            return view.copy()
        out = np.empty(view.nbytes, np.uint8)
        for lo, hi, src, off in o.runs(_address(view), view.nbytes):
            out[lo:hi] = view[lo:hi] if src is None else src.view[off:off + hi - lo]
        return out
