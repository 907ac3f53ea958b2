"""Simulated memory costs only what is written: an allocation is address space until a page
is written, reads of untouched memory give zeros without committing anything, and the
provider reports the bytes touched. The memory estimate of a scenario bounds what it holds."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from cuda.bindings import runtime as cudart

from commsim.scenario.memory_estimate import MiB, estimate_host_bytes
from commsim.scenario.model import Group, Scenario, Workload
from commsim.scenario.schema import load
from commsim.sim import SimFabric, spawn_driver
from commsim.sim.host_memory import PAGE, MemoryProvider, resident_bytes, written_pages
from commsim.topology import build_preset

ROOT = Path(__file__).resolve().parents[2]


def test_untouched_memory_commits_nothing_and_reads_as_zeros() -> None:
    mem = MemoryProvider(count_touched=True)
    a = mem.allocate(64 * MiB, "a1")
    assert resident_bytes(a) == 0
    assert int(a.sum()) == 0                    # a read of every page: the zero page
    assert resident_bytes(a) == 0
    a[5] = 1
    a[3 * MiB: 3 * MiB + 2 * PAGE] = 7           # two more pages
    assert resident_bytes(a) == 3 * PAGE
    # The count over present pages only (release's) agrees with the per-page map.
    assert int(np.count_nonzero(written_pages(a))) * PAGE == 3 * PAGE
    mem.release(a, "a1")
    assert mem.touched == 3 * PAGE


def test_driver_memory_is_lazy_end_to_end() -> None:
    fabric = SimFabric(build_preset("hgx-h100-8"), memory=MemoryProvider(count_touched=True))
    d = spawn_driver(fabric, next(iter(fabric.cluster.gpu_refs())))
    err, ptr = d.cudaMalloc(256 * MiB)
    assert err == cudart.cudaError_t.cudaSuccess
    (err,) = d.cudaMemset(ptr + 100 * MiB, 9, 10 * PAGE)
    assert err == cudart.cudaError_t.cudaSuccess
    err, host = d.memcpy_dtoh(ptr + 200 * MiB, 8 * MiB)     # untouched: zeros
    assert err == cudart.cudaError_t.cudaSuccess and not host.any()
    err, host = d.memcpy_dtoh(ptr + 100 * MiB, PAGE)
    assert (host == 9).all()
    d.cudaFree(ptr)
    assert fabric.memory.touched == 10 * PAGE


def test_estimate_counts_what_the_run_holds() -> None:
    rack = load(ROOT / "scenarios" / "topologies" / "gb200-nvl72.toml")
    est = estimate_host_bytes(rack)
    # 72 ranks get 4 KiB + 256 KiB + 8 MiB back, and stage the 4 KiB input; the larger inputs
    # map pages of the one input tape (commsim/sim/shared_pages.py), so they are not counted
    # once per rank. The tray group adds a little.
    per_rank = 8 * MiB + 256 * 1024 + 2 * 4096
    assert 72 * per_rank <= est.parts["device memory touched"] < 72 * (per_rank + 8 * MiB)
    assert est.parts["reference"] < 64 * MiB            # O(message), not O(ranks x message)
    assert est.total == sum(est.parts.values())
    assert "MiB of host memory" in est.describe()
    c = build_preset("gb200-nvl72")
    refs = tuple(c.gpu_refs())
    big = Scenario(name="ar256", cluster=c, placement=refs, groups=(Group("world", tuple(range(72))),),
                   workload=Workload(sizes=(256 * MiB,)))
    e = estimate_host_bytes(big)
    assert e.parts["device memory touched"] == 0        # past every workspace: the nccl fallback
    assert e.parts["fallback sum"] >= 4 * 128 * 1024 * 1024
