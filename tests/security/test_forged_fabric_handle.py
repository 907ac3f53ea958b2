"""A FABRIC handle made up for cudaMalloc memory, which the driver never exports as FABRIC.

Found once: in process mode a handle's 64 bytes were accepted whenever they were sealed like
the run's handles, and that seal is keyed by the run's seed, which a program can know; a
rank that rewrote a peer's legacy IPC handle into a FABRIC one imported and mapped memory
that cudaMalloc made. The driver answers an import of bytes it never exported with
CUDA_ERROR_INVALID_VALUE (thread mode: the bytes resolve to nothing), and process mode now
answers the same: an import needs the exporter's record that it exported a FABRIC handle."""

from __future__ import annotations

import os

from commsim.driver import FABRIC, LAZY_ENABLE_PEER_ACCESS, check
from commsim.group import LocalWorld
from commsim.procs.launcher import run_ranks_procs
from commsim.sim import SimFabric, spawn_driver
from commsim.sim.process_fabric import _HEAD
from commsim.topology import GpuRef, build_preset

CLUSTER = build_preset("gb200-nvl72:1")
PAIR = [GpuRef(CLUSTER.hosts[0].name, 0), GpuRef(CLUSTER.hosts[0].name, 1)]


def forge_fabric_for_cudamalloc(wg, d):
    """Rank 0 cudaMallocs and shares its legacy IPC handle; rank 1 rewrites it into a FABRIC
    handle of the same allocation, as well as the run's own code would seal one, and imports
    it."""
    ptr = check("cudaMalloc", d.cudaMalloc(1 << 21))
    handles = wg.all_gather_object(bytes(check("ipc", d.cudaIpcGetMemHandle(ptr))))
    out = None
    if wg.rank == 1:
        f = d.fabric
        if hasattr(f, "_pad"):         # process mode: bytes sealed with the run's seed
            head = b"CSFABRIC" + handles[0][8:_HEAD.size]
            forged = head + f._pad(head)
        else:                          # thread mode: the blob the fabric would make for it
            aid, _ = f.ipc_handles[handles[0]]
            forged = f._blob(b"CSFABRIC", aid)
        err, _ = d.cuMemImportFromShareableHandle(forged, FABRIC)
        out = str(err)
        # the legacy path of the same memory still works
        err, p = d.cudaIpcOpenMemHandle(handles[0], LAZY_ENABLE_PEER_ACCESS)
        out += " / legacy " + str(err)
        check("close", d.cudaIpcCloseMemHandle(p))
    wg.barrier()
    check("cudaFree", d.cudaFree(ptr))
    return out


def in_threads(fn):
    fabric = SimFabric(CLUSTER, 0)
    drivers = [spawn_driver(fabric, g) for g in PAIR]
    outcomes = LocalWorld(len(PAIR), 0).run(lambda wg: fn(wg, drivers[wg.rank]))
    return [("ok", o.value) if o.ok else ("error", repr(o.error)) for o in outcomes]


def test_a_forged_fabric_handle_for_cudamalloc_memory_is_refused_in_both_modes():
    threads = in_threads(forge_fabric_for_cudamalloc)
    procs = run_ranks_procs(forge_fabric_for_cudamalloc, CLUSTER, PAIR, timeout=30)
    assert procs == threads, (procs, threads)
    assert threads[1][1] == ("<CUresult.CUDA_ERROR_INVALID_VALUE: 1> / "
                             "legacy <cudaError_t.cudaSuccess: 0>"), threads
