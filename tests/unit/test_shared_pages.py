"""Bytes that exist elsewhere already cost no new host pages: staging a window of a sealed
input tape maps its pages copy-on-write, a multimem store backs every member with one sealed
copy, and reads go through that one copy, so no member's pages are mapped (RSS counts every
mapping). Every byte still reads what a copy would have left, writes included."""

from __future__ import annotations

import numpy as np
from cuda.bindings import runtime as cudart

from commsim.scenario.memory_estimate import MiB
from commsim.scenario.model import Group, Scenario, Workload
from commsim.scenario.reference import Reference
from commsim.scenario.runner import run_scenario
from commsim.sim import SimFabric, spawn_driver
from commsim.sim import fabric as F
from commsim.sim.host_memory import PAGE, MemoryProvider
from commsim.sim.shared_pages import EXCLUSIVE, FILE_PAGE, PRESENT, SealedArray, page_flags
from commsim.topology import build_preset


def _pages(a: np.ndarray) -> tuple[int, int, int]:
    """(pages mapped at all, private written pages, file pages) behind `a`."""
    v = page_flags(a.ctypes.data, a.nbytes)
    present = (v & PRESENT) != 0
    file = present & ((v & FILE_PAGE) != 0)
    return int(present.sum()), int((present & ~file & ((v & EXCLUSIVE) != 0)).sum()), int(file.sum())


def _tape(nbytes: int) -> SealedArray:
    return SealedArray(nbytes, lambda a: a.__setitem__(slice(None), np.arange(nbytes) % 251))


def test_staging_a_sealed_window_maps_pages_and_writes_stay_private() -> None:
    tape, mem = _tape(4 * MiB), MemoryProvider()
    a, b = mem.allocate(8 * MiB, "a"), mem.allocate(8 * MiB, "b")
    src = tape.array[3 * PAGE: 3 * PAGE + 2 * MiB + 100]          # a tail past the last page
    for dst in (a[PAGE: PAGE + src.size], b[PAGE: PAGE + src.size]):
        mem.copy_in(dst, src)
        assert np.array_equal(dst, src)
    assert _pages(a)[1] <= 1            # only the partial tail page is a private copy
    assert mem.canonical(a[PAGE: PAGE + MiB]) is not None
    a[PAGE + 10] = 7                     # copy on write: a alone sees it
    assert a[PAGE + 10] == 7 and b[PAGE + 10] == src[10] and tape.array[3 * PAGE + 10] == src[10]
    assert mem.canonical(a[PAGE: PAGE + MiB]) is None                # that page is a's own now
    assert np.array_equal(mem.read_copy(a[PAGE: PAGE + src.size])[11:], src[11:])


def test_a_host_write_to_the_tape_after_sealing_is_staged_too() -> None:
    tape, mem = _tape(2 * MiB), MemoryProvider()
    tape.array[5 * PAGE + 1] = 200       # the host's private copy of that page
    a = mem.allocate(4 * MiB, "a")
    mem.copy_in(a[: 2 * MiB], tape.array)
    assert a[5 * PAGE + 1] == 200 and np.array_equal(a[: 2 * MiB], tape.array)


def test_misaligned_staging_copies() -> None:
    tape, mem = _tape(2 * MiB), MemoryProvider()
    a = mem.allocate(4 * MiB, "a")
    mem.copy_in(a[1: 1 + MiB], tape.array[: MiB])
    assert np.array_equal(a[1: 1 + MiB], tape.array[: MiB])
    assert _pages(a)[2] == 0 and mem.canonical(a[1: 1 + MiB]) is None


def test_broadcast_reads_map_no_member_page_until_one_writes() -> None:
    mem = MemoryProvider()
    members = [mem.allocate(4 * MiB, f"m{i}") for i in range(8)]
    data = (np.arange(MiB + 3000) % 253).astype(np.uint8)
    dsts = [m[PAGE + 500: PAGE + 500 + data.size] for m in members]
    mem.broadcast(dsts, data)
    for m, d in zip(members, dsts):
        assert np.array_equal(mem.read_copy(d), data)
        # read through the sealed copy: only the two partial end pages were written here
        assert _pages(m)[0] <= 2
    members[3][PAGE + 600] ^= 0xFF       # a unicast write to one member
    assert mem.read_copy(dsts[3])[100] == data[100] ^ 0xFF
    assert mem.read_copy(dsts[4])[100] == data[100]


def test_released_allocations_leave_no_origins() -> None:
    mem = MemoryProvider(count_touched=True)
    a = mem.allocate(2 * MiB, "a")
    mem.broadcast([a[: MiB], a[MiB:]], np.ones(MiB, np.uint8))
    mem.release(a, "a")
    assert not mem._shared and mem.touched == 2 * MiB      # file pages count as written


def test_a_multicast_all_reduce_costs_about_one_copy_not_one_per_rank() -> None:
    """8 ranks, 8 MiB bfloat16 (multicast): the inputs are mapped from one tape and the
    result from one sealed copy per chunk, so the private pages are a small fraction of the
    bytes the ranks wrote; the results stay exact (the run checks them)."""
    providers: list[MemoryProvider] = []
    private = []
    orig_init, orig_release = F.MemoryProvider.__init__, F.MemoryProvider.release

    def init(self: MemoryProvider) -> None:
        orig_init(self, count_touched=True)
        providers.append(self)

    def release(self: MemoryProvider, array: np.ndarray, tag: str) -> None:
        private.append(_pages(array)[1] * PAGE)
        orig_release(self, array, tag)

    c = build_preset("gb200-nvl72")
    refs = tuple(c.gpu_refs())[:8]
    sc = Scenario(name="mc8", cluster=c, placement=refs, groups=(Group("world", tuple(range(8))),),
                  workload=Workload(ops=("all_reduce",), sizes=(8 * MiB,), dtypes=("bfloat16",)))
    F.MemoryProvider.__init__, F.MemoryProvider.release = init, release
    try:
        res = run_scenario(sc)
    finally:
        F.MemoryProvider.__init__, F.MemoryProvider.release = orig_init, orig_release
    assert res.ok, res.failures
    assert set(res.backends.values()) == {"multicast"}
    touched = sum(p.touched for p in providers)
    assert touched >= 8 * 2 * 8 * MiB                  # every rank's input and result
    assert sum(private) < touched / 8


def test_the_reference_tape_is_sealed_from_the_shared_size_on() -> None:
    big = Reference(0, "g", 4, "all_reduce", MiB, "bfloat16")
    assert big.stride * 2 % PAGE == 0
    assert SealedArray.containing(big.input(3).data_ptr(), 2 * MiB) is not None
    small = Reference(0, "g", 4, "all_reduce", 1024, "bfloat16")
    assert small.stride == 61 and not hasattr(small, "sealed")


def test_freed_memory_returns_its_pages_while_a_view_still_holds_it() -> None:
    fabric = SimFabric(build_preset("hgx-h100-8"), memory=MemoryProvider(count_touched=True))
    d = spawn_driver(fabric, next(iter(fabric.cluster.gpu_refs())))
    err, ptr = d.cudaMalloc(8 * MiB)
    assert err == cudart.cudaError_t.cudaSuccess
    d.cudaMemset(ptr, 3, 8 * MiB)
    held = d.view(ptr, 8 * MiB)          # e.g. a peer's stale mapping, or a kernel's view
    assert _pages(held)[1] == 8 * MiB // PAGE
    (err,) = d.cudaFree(ptr)
    assert err == cudart.cudaError_t.cudaSuccess
    assert _pages(held)[0] == 0          # nothing mapped behind it any more
    assert fabric.memory.touched == 8 * MiB


def test_sources_no_page_refers_to_are_dropped_and_reads_stay_right() -> None:
    mem = MemoryProvider()
    members = [mem.allocate(2 * MiB, f"m{i}") for i in range(2)]
    for k in range(100):                 # each store replaces the last one's pages
        data = np.full(MiB, k % 256, np.uint8)
        mem.broadcast([m[: MiB] for m in members], data)
    # chunks of a later store beside the last one: two sources per member in use
    mem.broadcast([m[MiB: MiB + 64 * PAGE] for m in members], np.full(64 * PAGE, 7, np.uint8))
    for m in members:
        o = mem._shared[m.ctypes.data]
        assert len(o.sources) <= 64 + 1
        got = mem.read_copy(m[: MiB + 64 * PAGE])
        assert (got[: MiB] == 99).all() and (got[MiB:] == 7).all()
