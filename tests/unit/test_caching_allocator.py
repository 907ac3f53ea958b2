"""The caching allocator model and graph-buffer registration over it (docs/lifecycle-rules.md
AL1-AL6)."""

from __future__ import annotations

import numpy as np
import pytest

from commsim.libmodels.caching_allocator import (LARGE_BUFFER, SMALL_BUFFER, CachingAllocator, round_size,
                                       segment_size)
from commsim.driver import CudaError, check
from commsim.libmodels.graph_buffers import OpenedBases, export_buffers, open_peer_buffers, range_start
from commsim.sim import SimFabric, spawn_driver
from commsim.topology import build_preset
from commsim.topology.model import GpuRef

MiB = 1 << 20


def drivers(n: int = 2, preset: str = "hgx-h100-8"):
    fabric = SimFabric(build_preset(preset), seed=0)
    return fabric, [spawn_driver(fabric, GpuRef(f"{fabric.cluster.hosts[0].name}", i)) for i in range(n)]


def test_size_classes():
    assert round_size(1) == 512 and round_size(513) == 1024
    assert segment_size(512) == SMALL_BUFFER                 # small requests: 2 MiB blocks
    assert segment_size(3 * MiB) == LARGE_BUFFER             # 1-10 MiB: split a 20 MiB block
    assert segment_size(11 * MiB) == 12 * MiB                # large: rounded to 2 MiB


def test_small_requests_share_one_cudamalloc_block():
    _, (d,) = drivers(1)
    a = CachingAllocator(d)
    ptrs = [a.malloc(4096) for _ in range(4)]
    assert len(a.segments) == 1 and a.segments[0].size == SMALL_BUFFER
    assert [p - ptrs[0] for p in ptrs] == [0, 4096, 8192, 12288]
    assert all(range_start(d, p) == ptrs[0] for p in ptrs)   # one base, four offsets
    assert d.ledger.count("allocation") == 1
    a.close()
    assert d.ledger.count() == 0


def test_free_caches_and_reuses_then_empty_cache_returns_memory():
    _, (d,) = drivers(1)
    a = CachingAllocator(d)
    p = a.malloc(3 * MiB)
    q = a.malloc(3 * MiB)                                    # the rest of the same 20 MiB block
    assert range_start(d, q) == range_start(d, p)
    a.free(p)
    a.free(q)
    assert d.ledger.count("allocation") == 1                 # cached, not freed (AL2)
    assert a.malloc(3 * MiB) == p                            # best fit reuses the merged block
    a.free(p)
    a.empty_cache()
    assert d.ledger.count("allocation") == 0 and not a.segments


def test_free_of_unknown_pointer_is_refused():
    _, (d,) = drivers(1)
    a = CachingAllocator(d)
    with pytest.raises(ValueError, match="not a pointer"):
        a.free(0x1234)


def test_expandable_segments_are_cumem_backed_and_have_no_ipc_handle():
    _, (d,) = drivers(1)
    a = CachingAllocator(d, expandable_segments=True)
    p = a.malloc(4096)
    q = a.malloc(3 * MiB)
    assert d.ledger.count("allocation") == 0                 # no cudaMalloc at all
    assert d.ledger.count("vmm_mapping") == 2                # one 2 MiB + one 20 MiB page
    for ptr in (p, q):
        err, _ = d.cudaIpcGetMemHandle(range_start(d, ptr))
        assert err.name == "cudaErrorInvalidValue"           # row L2, vLLM#42609
    a.close()
    assert d.ledger.count() == 0


def test_expandable_segment_grows_in_place():
    _, (d,) = drivers(1)
    a = CachingAllocator(d, expandable_segments=True)
    ptrs = [a.malloc(MiB) for _ in range(3)]                 # 3 MiB of small requests
    assert len(a.segments) == 1 and a.segments[0].size == 2 * SMALL_BUFFER
    assert ptrs[1] - ptrs[0] == MiB and ptrs[2] - ptrs[1] == MiB
    a.close()


def test_graph_pool_keeps_blocks_until_the_graph_is_destroyed():
    _, (d,) = drivers(1)
    a = CachingAllocator(d)
    eager = a.malloc(4096)
    with a.capture() as pool:
        x = a.malloc(4096)
        a.free(x)
        y = a.malloc(4096)                                   # reused inside the private pool
        assert y == x
    assert range_start(d, y) != range_start(d, eager)        # a separate segment
    a.free(y)
    a.empty_cache()                                          # the graph still holds its pool
    assert d.ledger.count("allocation") == 2
    a.release_graph_pool(pool)
    assert d.ledger.count("allocation") == 1
    a.free(eager)
    a.empty_cache()
    assert d.ledger.count() == 0


def test_destroyed_pool_releases_a_live_block_when_it_is_freed():
    _, (d,) = drivers(1)
    a = CachingAllocator(d)
    with a.capture() as pool:
        z = a.malloc(4096)
    a.release_graph_pool(pool)
    assert d.ledger.count("allocation") == 1                 # z still alive
    a.free(z)
    assert d.ledger.count("allocation") == 0


def test_registration_opens_each_base_once_and_adds_offsets():
    _, (d0, d1) = drivers(2)
    a0 = CachingAllocator(d0)
    bufs = [a0.malloc(4096) for _ in range(5)] + [a0.malloc(3 * MiB)]
    for i, p in enumerate(bufs):
        check("cudaMemcpy", d0.memcpy_htod(p, np.full(16, i + 1, np.uint8)))
    metas = export_buffers(d0, bufs)
    assert len({h for h, _ in metas}) == 2                   # two bases: small and large block
    opened = OpenedBases(d1)
    ptrs = open_peer_buffers(opened, [metas, []], me=1)[0]
    assert len(opened.by_handle) == 2
    assert d1.ledger.count("ipc_mapping") == 2               # opened once each, not six times
    for i, p in enumerate(ptrs):
        assert check("cudaMemcpy", d1.memcpy_dtoh(p, 16)).tolist() == [i + 1] * 16
    assert opened.close() == []
    assert d1.ledger.count() == 0
    a0.close()


def test_registration_over_expandable_segments_fails_with_the_driver_code():
    _, (d0, _) = drivers(2)
    a0 = CachingAllocator(d0, expandable_segments=True)
    with pytest.raises(CudaError) as ei:
        export_buffers(d0, [a0.malloc(4096)])
    assert ei.value.api == "cudaIpcGetMemHandle" and ei.value.name == "cudaErrorInvalidValue"
    a0.close()


def test_range_start_outside_any_allocation_is_invalid_value():
    _, (d,) = drivers(1)
    with pytest.raises(CudaError, match="CUDA_ERROR_INVALID_VALUE"):
        range_start(d, 0x10)


def _capture_run(expandable: bool, graph_buffers: str, nops: int = 4):
    import torch

    from commsim.libmodels import caching_allocator as allocators
    from commsim.communicator import Communicator
    from commsim.group import LocalWorld
    from commsim.policy import Policy
    fabric, ds = drivers(2)
    pol = Policy(order=("ipc", "nccl"), params={"max_size": 8 * MiB, "graph_buffers": graph_buffers},
                 fallback_on_setup_error=False)

    def rank(g):
        d = ds[g.rank]
        allocators.install(d, CachingAllocator(d, expandable_segments=expandable))
        comm = Communicator(g, d, pol)
        try:
            xs = [torch.full((2048,), float(g.rank + i), dtype=torch.bfloat16) for i in range(nops)]
            with comm.capture():
                ys = [comm.all_reduce(x) for x in xs]
            opened = d.ledger.count("ipc_mapping")
            return opened, [y[0].item() for y in ys]
        finally:
            comm.close()
            allocators.for_process(d).close()

    outs = LocalWorld(2, seed=0).run(rank)
    return outs, ds


def test_captured_sub_allocations_are_opened_once_per_base():
    outs, ds = _capture_run(False, "register")
    assert all(o.ok for o in outs), [o.error for o in outs]
    for o in outs:
        opened, vals = o.value
        assert opened == 2                      # the workspace + one graph-pool block, not 1 + 4
        assert vals == [1.0, 3.0, 5.0, 7.0]     # (0+i) + (1+i)
    assert all(d.ledger.count() == 0 for d in ds)


def test_captured_expandable_segments_fail_registration_with_the_driver_code():
    outs, ds = _capture_run(True, "register")
    from commsim.backends.base import SetupFailed
    errs = [o.error for o in outs]
    assert all(isinstance(e, SetupFailed) and e.step == "register: export graph buffers" for e in errs), errs
    assert all(e.error.name == "cudaErrorInvalidValue" and e.error.api == "cudaIpcGetMemHandle" for e in errs)
    assert all(d.ledger.count() == 0 for d in ds)


def test_default_copies_instead_of_registering_expandable_buffers():
    outs, ds = _capture_run(True, "auto")
    assert all(o.ok for o in outs), [o.error for o in outs]
    assert all(o.value == (1, [1.0, 3.0, 5.0, 7.0]) for o in outs)   # only the workspace is open
    assert all(d.ledger.count() == 0 for d in ds)


def test_a_process_allocator_does_not_keep_its_process_alive():
    """The allocator lives as long as its simulated process, not longer: once nothing refers
    to the driver, both go (a table whose entries held their drivers kept every scenario's
    machine alive in a sweep worker)."""
    import gc
    import weakref

    from commsim.libmodels import caching_allocator as allocators
    fabric, (d,) = drivers(1)
    allocators.install(d, CachingAllocator(d))
    assert allocators.for_process(d) is allocators.for_process(d)
    p = allocators.for_process(d).malloc(4096)
    allocators.for_process(d).free(p)
    allocators.for_process(d).close()
    gone = weakref.ref(d)
    del d, fabric
    gc.collect()
    assert gone() is None


# -- statistics (torch.cuda.memory_stats's shape) and rule AL7 --------------------------------

def _stat(a: CachingAllocator, name: str, pool: str = "all") -> dict:
    return a.stats.nested()[name][pool]


def test_statistics_follow_allocations_frees_and_releases():
    _, (d,) = drivers(1)
    a = CachingAllocator(d)
    p = a.malloc(1000)                                       # small: rounds to 1024
    q = a.malloc(3 * MiB)                                    # large: splits a 20 MiB block
    assert _stat(a, "allocated_bytes") == {"current": 1024 + 3 * MiB, "peak": 1024 + 3 * MiB,
                                           "allocated": 1024 + 3 * MiB, "freed": 0}
    assert _stat(a, "requested_bytes", "small_pool")["current"] == 1000
    assert _stat(a, "reserved_bytes", "small_pool")["current"] == SMALL_BUFFER
    assert _stat(a, "reserved_bytes", "large_pool")["current"] == LARGE_BUFFER
    assert _stat(a, "segment")["current"] == 2 and a.stats.nested()["num_device_alloc"] == 2
    # Each segment is split now: its free rest is inactive and not releasable.
    assert _stat(a, "inactive_split")["current"] == 2
    assert _stat(a, "inactive_split_bytes")["current"] == (SMALL_BUFFER - 1024) + (LARGE_BUFFER - 3 * MiB)
    a.free(q)
    assert _stat(a, "allocated_bytes") == {"current": 1024, "peak": 1024 + 3 * MiB,
                                           "allocated": 1024 + 3 * MiB, "freed": 3 * MiB}
    assert _stat(a, "inactive_split", "large_pool")["current"] == 0   # merged whole again
    a.free(p)
    a.empty_cache()
    s = a.stats.nested()
    assert s["reserved_bytes"]["all"]["current"] == 0 and s["segment"]["all"]["freed"] == 2
    assert s["num_device_free"] == 2 and s["reserved_bytes"]["all"]["peak"] == SMALL_BUFFER + LARGE_BUFFER
    assert s["active_bytes"] == s["allocated_bytes"]
    a.stats.reset_peak()
    assert _stat(a, "reserved_bytes")["peak"] == 0
    a.stats.reset_accumulated()
    assert _stat(a, "allocated_bytes")["allocated"] == 0 and a.stats.nested()["num_device_alloc"] == 0


def test_expandable_segment_statistics_count_pages():
    _, (d,) = drivers(1)
    a = CachingAllocator(d, expandable_segments=True)
    p = a.malloc(3 * MiB)
    q = a.malloc(30 * MiB)                                   # grows the same reservation
    s = a.stats.nested()
    assert s["segment"]["large_pool"]["current"] == 1
    assert s["reserved_bytes"]["large_pool"]["current"] == a.reserved_bytes()
    assert s["num_device_alloc"] == a.reserved_bytes() // LARGE_BUFFER
    a.free(p)
    a.free(q)
    a.close()


def test_memory_fraction_refuses_growth_past_the_limit_without_a_driver_call():
    _, (d,) = drivers(1)
    a = CachingAllocator(d)
    a.limit = LARGE_BUFFER
    a.malloc(3 * MiB)                                        # one 20 MiB segment: within
    calls = d.ledger.count("allocation")
    with pytest.raises(CudaError) as e:
        a.malloc(30 * MiB)
    assert e.value.name == "cudaErrorMemoryAllocation" and "fraction" in e.value.context
    assert d.ledger.count("allocation") == calls             # the driver was never asked
    assert a.stats.nested()["num_ooms"] == 1 and a.stats.nested()["num_alloc_retries"] == 0
    a.close()


def test_out_of_memory_releases_cached_segments_and_retries_once():
    """Rule AL7: a refused growth frees the idle cached segments and tries again."""
    _, (d,) = drivers(1)
    a = CachingAllocator(d)
    a.free(a.malloc(3 * MiB))                                # a cached, idle 20 MiB segment
    a.limit = LARGE_BUFFER + 12 * MiB
    p = a.malloc(30 * MiB)                                   # fits only once the 20 MiB goes
    assert a.reserved_bytes() == 30 * MiB and d.ledger.count("allocation") == 1
    s = a.stats.nested()
    assert s["num_alloc_retries"] == 1 and s["num_ooms"] == 0 and s["num_device_free"] == 1
    a.free(p)
    a.close()
