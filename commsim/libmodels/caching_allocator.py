"""A model of the caching allocator serving stacks allocate through (PyTorch's
CUDACachingAllocator), over the Driver protocol. Rules AL1-AL6 of docs/lifecycle-rules.md.

    alloc = CachingAllocator(driver)                       # cudaMalloc-backed segments
    p = alloc.malloc(4096)                                 # a sub-allocation of a 2 MiB block
    with alloc.capture() as pool:                          # CUDA-graph capture: private pool
        q = alloc.malloc(8192)
    alloc.release_graph_pool(pool)                         # the graph is destroyed
    alloc.close()                                          # every segment back to the driver

What serving stacks rely on, and what bites them:
- small requests share one `cudaMalloc` block, so a tensor's pointer is usually *not* the
  base of an allocation: legacy IPC must export the block's base and send an offset (AL3);
- with `expandable_segments` the memory is cuMem-backed (reserve + create + map), which has
  no legacy IPC handle: `cudaIpcGetMemHandle` answers `cudaErrorInvalidValue` (AL4);
- blocks handed out during a capture come from a graph-private pool that keeps them alive
  until the graph is destroyed, whatever the tensors do (AL5).

The model keeps PyTorch's size classes, best-fit splitting, its statistics
(libmodels/allocator_stats.py: what `torch.cuda.memory_stats` reads), its per-process memory fraction
and its retry after an out-of-memory (rule AL7), not its stream bookkeeping or garbage
collection thresholds: those decide *when* memory returns, not which allocation a pointer
belongs to.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Any, Iterator

from commsim.libmodels.allocator_stats import DeviceStats
from commsim.driver import CAPTURE_MODE_RELAXED, CudaError, Driver, access_desc, alloc_prop, check

# c10/cuda/CUDACachingAllocator.cpp constants (rule AL1).
MIN_BLOCK = 512                     # kMinBlockSize: every size rounds up to 512 B
SMALL_SIZE = 1 << 20                # kSmallSize: the largest "small" request
SMALL_BUFFER = 2 << 20              # kSmallBuffer: small requests pack into 2 MiB blocks
MIN_LARGE_ALLOC = 10 << 20          # kMinLargeAlloc: 1-10 MiB requests split a 20 MiB block
LARGE_BUFFER = 20 << 20             # kLargeBuffer
ROUND_LARGE = 2 << 20               # kRoundLarge: larger requests round up to 2 MiB
# Note [Expandable Segments]: 2 MiB pages for the small pool, 20 MiB for the large one; the
# VA reserved per segment covers the device (modelled as a fixed, generous reservation).
EXPANDABLE_RESERVE = 64 << 30
# PyTorch requests POSIX-fd shareable handles for expandable segments (pytorch#130890).
_POSIX_FD = 0x1


def round_size(size: int) -> int:
    return max(MIN_BLOCK, -(-size // MIN_BLOCK) * MIN_BLOCK)


def segment_size(size: int) -> int:
    """What one new `cudaMalloc` segment holds for a request of `size` (already rounded)."""
    if size <= SMALL_SIZE:
        return SMALL_BUFFER
    if size < MIN_LARGE_ALLOC:
        return LARGE_BUFFER
    return -(-size // ROUND_LARGE) * ROUND_LARGE


@dataclass(eq=False)
class Block:
    segment: "Segment"
    offset: int
    size: int
    allocated: bool = False
    requested: int = 0              # the caller's size before rounding (requested_bytes)

    @property
    def ptr(self) -> int:
        return self.segment.base + self.offset


@dataclass(eq=False)
class Segment:
    """One driver allocation: a `cudaMalloc` range, or an expandable cuMem reservation with
    the pages mapped so far (`size` counts mapped bytes)."""

    base: int
    size: int
    small: bool
    expandable: bool
    pool: "GraphPool | None"
    blocks: list[Block] = field(default_factory=list)
    pages: list[tuple[int, int, int]] = field(default_factory=list)   # (va, size, handle)

    def idle(self) -> bool:
        return not any(b.allocated for b in self.blocks)


@dataclass(eq=False)
class GraphPool:
    """A CUDA graph's private pool (Note [Interaction with CUDA graph capture], rule AL5)."""

    pool_id: int
    released: bool = False          # the graph was destroyed


class CachingAllocator:
    """One process's caching allocator on its current device."""

    def __init__(self, driver: Driver, expandable_segments: bool = False):
        self.driver = driver
        self.expandable = expandable_segments
        self.device = check("cudaGetDevice", driver.cudaGetDevice())
        self.segments: list[Segment] = []
        self._blocks: dict[int, Block] = {}            # ptr of an allocated block -> block
        self._free: set[Block] = set()                 # every free block (best fit looks here)
        self._capturing: GraphPool | None = None
        self._next_pool = 1
        self.stats = DeviceStats()
        # torch.cuda.set_per_process_memory_fraction: the most bytes this allocator may
        # reserve from the driver (None: no limit but the device's memory).
        self.limit: int | None = None

    # -- allocation ------------------------------------------------------------------------
    def malloc(self, size: int, pool: GraphPool | None = None) -> int:
        """A device pointer for `size` bytes, from `pool` when given, else from the capture
        in progress, else from the default pool; raises CudaError when the driver refuses."""
        if size < 0:
            raise ValueError(f"malloc size must be >= 0, got {size}")
        pool = pool or self._capturing
        if pool is not None and pool.released:
            raise RuntimeError(f"graph pool {pool.pool_id} was released: its graph is gone")
        requested = size
        size = round_size(size)
        small = size <= SMALL_SIZE
        block = self._best_fit(size, small, pool)
        seg = block.segment if block is not None else (
            self._expandable_segment(small, pool) if self.expandable else None)
        before = self._inactive(seg)
        if block is None:
            block = self._grow(size, small, pool)
            if block.segment is not seg:      # a new segment (a retry may have released seg)
                seg, before = block.segment, (0, 0)
        self._split(block, size, small)
        block.allocated = True
        block.requested = requested
        self._free.discard(block)
        self._blocks[block.ptr] = block
        st = self.stats
        st.change("allocation", small, 1)
        st.change("allocated_bytes", small, size)
        st.change("requested_bytes", small, requested)
        self._account_inactive(seg, before)
        return block.ptr

    def _best_fit(self, size: int, small: bool, pool: GraphPool | None) -> Block | None:
        fits = [b for b in self._free if b.segment.pool is pool and b.segment.small == small
                and b.size >= size]
        return min(fits, key=lambda b: (b.size, b.ptr), default=None)

    def _grow(self, size: int, small: bool, pool: GraphPool | None) -> Block:
        """A new segment (or more pages of the expandable one). Rule AL7: when the driver
        refuses, or the memory fraction would be exceeded, PyTorch frees its cached idle
        segments and tries once more (c10/cuda/CUDACachingAllocator.cpp, `malloc`:
        alloc_block, then release_cached_blocks and alloc_block again, counted in
        num_alloc_retries); a second refusal is the out-of-memory error (num_ooms)."""
        try:
            return self._grow_once(size, small, pool)
        except CudaError:
            # Not during a capture: torch releases cached blocks only when no capture is
            # underway (`captures_underway.empty()`).
            idle = [s for s in self.segments if s.pool is None and s.idle()] \
                if self._capturing is None else []
            if not idle:
                self.stats.count("num_ooms")
                raise
        for seg in idle:
            self._release(seg)
        self.stats.count("num_alloc_retries")
        try:
            return self._grow_once(size, small, pool)
        except CudaError:
            self.stats.count("num_ooms")
            raise

    def _grow_once(self, size: int, small: bool, pool: GraphPool | None) -> Block:
        if self.expandable:
            return self._grow_expandable(size, small, pool)
        n = segment_size(size)
        self._within_limit(n)
        base = check("cudaMalloc", self.driver.cudaMalloc(n)) if pool is None else self._malloc_capturing(n)
        self._count_segment(small, n, new=True)
        seg = Segment(base, n, small, False, pool)
        seg.blocks.append(Block(seg, 0, n))
        self.segments.append(seg)
        self._free.add(seg.blocks[0])
        return seg.blocks[0]

    def _malloc_capturing(self, n: int) -> int:
        """A graph pool grows during a capture: PyTorch's `cudaMallocMaybeCapturing` puts the
        thread in RELAXED capture mode around its own cudaMalloc (which a GLOBAL or
        THREAD_LOCAL capture refuses otherwise, rule CG1 of docs/lifecycle-rules.md) and
        restores the mode after."""
        d = self.driver
        old = check("cudaThreadExchangeStreamCaptureMode", d.cudaThreadExchangeStreamCaptureMode(CAPTURE_MODE_RELAXED))
        try:
            return check("cudaMalloc", d.cudaMalloc(n))
        finally:
            check("cudaThreadExchangeStreamCaptureMode", d.cudaThreadExchangeStreamCaptureMode(old))

    def _grow_expandable(self, size: int, small: bool, pool: GraphPool | None) -> Block:
        """Map more pages at the end of this pool's one expandable segment (Note [Expandable
        Segments]): cuMemCreate + cuMemMap + cuMemSetAccess per page."""
        d = self.driver
        seg = self._expandable_segment(small, pool)
        if seg is None:
            base = check("cuMemAddressReserve", d.cuMemAddressReserve(EXPANDABLE_RESERVE, 0, 0, 0))
            seg = Segment(base, 0, small, True, pool)
            self.segments.append(seg)
        tail = seg.blocks[-1] if seg.blocks and not seg.blocks[-1].allocated else None
        need = size - (tail.size if tail else 0)
        page = SMALL_BUFFER if small else LARGE_BUFFER
        grow = -(-need // page) * page
        if seg.size + grow > EXPANDABLE_RESERVE:
            raise MemoryError(f"expandable segment full: {seg.size + grow} B > {EXPANDABLE_RESERVE} B")
        self._within_limit(grow)
        prop = alloc_prop(self.device, _POSIX_FD)
        for off in range(0, grow, page):
            va = seg.base + seg.size + off
            h = check("cuMemCreate", d.cuMemCreate(page, prop, 0))
            try:
                check("cuMemMap", d.cuMemMap(va, page, 0, h, 0))
            except Exception:
                d.cuMemRelease(h)
                raise
            seg.pages.append((va, page, h))
            self._count_segment(small, page, new=seg.size == 0 and off == 0)
            check("cuMemSetAccess", d.cuMemSetAccess(va, page, [access_desc(self.device)], 1))
        if tail is not None:
            tail.size += grow
        else:
            tail = Block(seg, seg.size, grow)
            seg.blocks.append(tail)
            self._free.add(tail)
        seg.size += grow
        return tail

    def _split(self, block: Block, size: int, small: bool) -> None:
        """Best-fit splitting: the rest stays a free block when big enough to be useful
        (small pool: any remainder >= 512 B; large pool: remainder > 1 MiB)."""
        rest = block.size - size
        if rest >= (MIN_BLOCK if small else SMALL_SIZE + 1):
            seg = block.segment
            i = seg.blocks.index(block)
            seg.blocks.insert(i + 1, Block(seg, block.offset + size, rest))
            self._free.add(seg.blocks[i + 1])
            block.size = size

    # -- free ------------------------------------------------------------------------------
    def free(self, ptr: int) -> None:
        """Return a block to its pool (rule AL2): the driver keeps the memory. A block of a
        destroyed graph's pool releases its segment once the segment is idle (AL5)."""
        block = self._blocks.pop(ptr, None)
        if block is None:
            raise ValueError(f"free of {ptr:#x}: not a pointer this allocator handed out")
        seg = block.segment
        before = self._inactive(seg)
        block.allocated = False
        self._free.add(block)
        st = self.stats
        st.change("allocation", seg.small, -1)
        st.change("allocated_bytes", seg.small, -block.size)
        st.change("requested_bytes", seg.small, -block.requested)
        i = seg.blocks.index(block)
        for j in (i + 1, i):                       # merge with free neighbours
            if 0 < j < len(seg.blocks) and not seg.blocks[j].allocated and not seg.blocks[j - 1].allocated:
                seg.blocks[j - 1].size += seg.blocks[j].size
                self._free.discard(seg.blocks[j])
                del seg.blocks[j]
        self._account_inactive(seg, before)
        if seg.pool is not None and seg.pool.released and seg.idle():
            self._release(seg)

    def empty_cache(self) -> None:
        """torch.cuda.empty_cache(): idle segments of the default pool go back to the driver."""
        for seg in [s for s in self.segments if s.pool is None and s.idle()]:
            self._release(seg)

    def _release(self, seg: Segment) -> None:
        d = self.driver
        self._account_inactive(seg, self._inactive(seg), (0, 0))
        self.segments.remove(seg)
        self._free.difference_update(seg.blocks)
        st = self.stats
        st.change("segment", seg.small, -1)
        st.change("reserved_bytes", seg.small, -seg.size)
        if not seg.expandable:
            check("cudaFree", d.cudaFree(seg.base))
            st.count("num_device_free")
            return
        for va, size, h in seg.pages:
            check("cuMemUnmap", d.cuMemUnmap(va, size))
            st.count("num_device_free")
            check("cuMemRelease", d.cuMemRelease(h))
        check("cuMemAddressFree", d.cuMemAddressFree(seg.base, EXPANDABLE_RESERVE))

    # -- statistics and limits --------------------------------------------------------------
    def _expandable_segment(self, small: bool, pool: GraphPool | None) -> Segment | None:
        return next((s for s in self.segments if s.expandable and s.pool is pool and s.small == small), None)

    def _within_limit(self, n: int) -> None:
        """The memory fraction (set_per_process_memory_fraction): reserving `n` more bytes
        past the limit is refused as the driver refuses, with cudaErrorMemoryAllocation and
        no driver call (CUDACachingAllocator.cpp alloc_block: `set_fraction &&
        total_allocated_memory + size > allowed_memory_maximum`)."""
        if self.limit is not None and self.reserved_bytes() + n > self.limit:
            raise CudaError("cudaMalloc", 2, "cudaErrorMemoryAllocation",
                            "out of memory",
                            f"the per-process memory fraction allows {self.limit} B; "
                            f"{self.reserved_bytes()} B are reserved")

    def _count_segment(self, small: bool, n: int, new: bool) -> None:
        st = self.stats
        if new:
            st.change("segment", small, 1)
        st.change("reserved_bytes", small, n)
        st.count("num_device_alloc")

    @staticmethod
    def _inactive(seg: Segment | None) -> tuple[int, int]:
        """The segment's inactive split blocks, count and bytes: free blocks of a segment
        split in more than one block (torch's inactive_split: free but not releasable)."""
        if seg is None or len(seg.blocks) < 2:
            return 0, 0
        free = [b.size for b in seg.blocks if not b.allocated]
        return len(free), sum(free)

    def _account_inactive(self, seg: Segment | None, before: tuple[int, int],
                          after: tuple[int, int] | None = None) -> None:
        """Move inactive_split(_bytes) by what one operation changed on `seg` (`after`
        defaults to the segment as it is now)."""
        if seg is None:
            return
        count, nbytes = self._inactive(seg) if after is None else after
        if count != before[0] or nbytes != before[1]:
            self.stats.change("inactive_split", seg.small, count - before[0])
            self.stats.change("inactive_split_bytes", seg.small, nbytes - before[1])

    # -- CUDA graphs -----------------------------------------------------------------------
    @contextlib.contextmanager
    def capture(self, pool: GraphPool | None = None) -> Iterator[GraphPool]:
        """Allocations inside come from a graph-private pool (`pool`, shared with earlier
        graphs as `torch.cuda.graph(pool=...)` asks, else a new one); frees inside return
        blocks to that pool, where the capture reuses them (rule AL5)."""
        if self._capturing is not None:
            raise RuntimeError("a capture is already in progress on this allocator")
        pool = self._capturing = pool or self.new_graph_pool()
        try:
            yield pool
        finally:
            self._capturing = None

    def new_graph_pool(self) -> GraphPool:
        """A private pool for one graph (what `capture()` opens; also for callers that hold
        the pool across calls, as a communicator's capture does)."""
        pool = GraphPool(self._next_pool)
        self._next_pool += 1
        return pool

    def release_graph_pool(self, pool: GraphPool) -> None:
        """The graph was destroyed: its idle segments go back to the driver now, the others
        when their last block is freed."""
        pool.released = True
        for seg in [s for s in self.segments if s.pool is pool and s.idle()]:
            self._release(seg)

    # -- queries ---------------------------------------------------------------------------
    def block_of(self, ptr: int) -> Block:
        for seg in self.segments:
            if seg.base <= ptr < seg.base + seg.size:
                for b in seg.blocks:
                    if b.ptr <= ptr < b.ptr + b.size:
                        return b
        raise ValueError(f"{ptr:#x} is not inside memory this allocator holds")

    def size_of(self, ptr: int) -> int:
        """The size of the allocated block at `ptr` (what torch's memory_allocated counts)."""
        return self._blocks[ptr].size

    def reserved_bytes(self) -> int:
        return sum(s.size for s in self.segments)

    def close(self) -> None:
        """Teardown: every segment back to the driver, live blocks or not (process exit)."""
        self._blocks.clear()
        for seg in list(self.segments):
            self._release(seg)


# The allocator of each simulated process (the Driver stands for the process), as torch has
# one per process: set by the runner from `[workload] allocator`, else a plain one on first use.
# Kept in the driver object's own dict (not through getattr: a hosted driver view forwards
# attributes to the driver it wraps), so it lives and dies with its process. A
# WeakKeyDictionary did not let it die: its value, the allocator, holds the driver, so no
# entry was ever dropped and every scenario's simulated machine stayed alive (thousands of
# drivers after a few hundred scenarios, all walked by each garbage collection).
_ATTR = "_commsim_process_allocator"


def install(driver: Driver, allocator: CachingAllocator) -> None:
    vars(driver)[_ATTR] = allocator


def uninstall(driver: Driver) -> None:
    """Forget the process's allocator (after its close): the driver <-> allocator cycle
    goes with it."""
    vars(driver).pop(_ATTR, None)


def for_process(driver: Driver) -> CachingAllocator:
    alloc = vars(driver).get(_ATTR)
    if alloc is None:
        alloc = vars(driver)[_ATTR] = CachingAllocator(driver)
    return alloc
