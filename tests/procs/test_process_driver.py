"""The driver's sharing rules across real processes, asserted equal to thread mode.

Each check is a rank function over (world group, driver) run once as greenlets over one
SimFabric and once as OS processes over ProcessFabrics in shared memory: the bytes an import
maps are the exporter's real bytes, and what may not be imported still fails with the
driver's code (rows L8, V9)."""

from __future__ import annotations

import os
import numpy as np

from commsim.driver import FABRIC, FD, LAZY_ENABLE_PEER_ACCESS, FdTransportError, access_desc, alloc_prop, check
from commsim.procs.launcher import run_ranks_procs
from commsim.topology import GpuRef, build_preset

from run_hygiene import leftover_segments
from thread_twin import run_ranks_threads

SIZE = 1 << 21


def legacy_ipc(wg, d):
    """Rank 0 exports, every rank opens, writes its mark, rank 0 reads them all back."""
    r = wg.rank
    own = check("cudaMalloc", d.cudaMalloc(4096))
    check("cudaMemset", d.cudaMemset(own, 0, 4096))
    h = check("cudaIpcGetMemHandle", d.cudaIpcGetMemHandle(own))
    hs = wg.all_gather_object(h)
    out = {}
    err, p = d.cudaIpcOpenMemHandle(hs[0], LAZY_ENABLE_PEER_ACCESS) if r else (None, own)
    out["open"] = str(err) if r else "own"
    if p is not None:
        check("write", d.memcpy_htod(p + r, np.array([r + 1], np.uint8)))
    bogus = d.cudaIpcOpenMemHandle(bytes(64), LAZY_ENABLE_PEER_ACCESS)[0]
    out["bogus"] = str(bogus)
    wg.barrier()
    if r == 0:
        out["bytes"] = check("read", d.memcpy_dtoh(own, wg.size)).tolist()
    if r and p is not None:
        check("close", d.cudaIpcCloseMemHandle(p))
    wg.barrier()
    check("cudaFree", d.cudaFree(own))
    wg.barrier()
    if r:   # the exporter freed it: the handle names nothing now
        out["after_free"] = str(d.cudaIpcOpenMemHandle(hs[0], LAZY_ENABLE_PEER_ACCESS)[0])
    out["held"] = d.ledger.summary()
    return out


def fabric_and_fd(wg, d):
    """FABRIC handles across hosts of one NVLink domain, POSIX fds within a host only."""
    r = wg.rank
    prop = alloc_prop(0, FABRIC | FD)
    prop.location.id = check("dev", d.cudaGetDevice())
    h = check("cuMemCreate", d.cuMemCreate(SIZE, prop, 0))
    fab = check("export", d.cuMemExportToShareableHandle(h, FABRIC, 0))
    fabs = wg.all_gather_object(bytes(fab))
    out = {}
    peer = (r + 1) % wg.size
    imp = check("import", d.cuMemImportFromShareableHandle(fabs[peer], FABRIC))
    va = check("reserve", d.cuMemAddressReserve(SIZE, 0, 0, 0))
    check("map", d.cuMemMap(va, SIZE, 0, imp, 0))
    check("access", d.cuMemSetAccess(va, SIZE, [access_desc(0)], 1))
    check("write", d.memcpy_htod(va + 8 * r, np.full(8, 10 + r, np.uint8)))
    wg.barrier()
    own_va = check("reserve", d.cuMemAddressReserve(SIZE, 0, 0, 0))
    check("map", d.cuMemMap(own_va, SIZE, 0, h, 0))
    check("access", d.cuMemSetAccess(own_va, SIZE, [access_desc(0)], 1))
    writer = (r - 1) % wg.size
    out["seen"] = check("read", d.memcpy_dtoh(own_va + 8 * writer, 8)).tolist()
    # POSIX fd to the next rank: works on one host, refused across hosts (row V9).
    fd = check("export fd", d.cuMemExportToShareableHandle(h, FD, 0))
    pids = wg.all_gather_object(d.getpid())
    hosts = wg.all_gather_object(d.gethostname())
    try:
        d.fd_channel().send(fd, pids[peer])
        out["send"] = "sent"
    except FdTransportError as e:
        out["send"] = f"refused errno {e.errno}"
    wg.barrier()
    src = (r - 1) % wg.size
    if hosts[src] == hosts[r]:
        got = d.fd_channel().receive(pids[src])
        imp2 = check("import fd", d.cuMemImportFromShareableHandle(got, FD))
        va2 = check("reserve", d.cuMemAddressReserve(SIZE, 0, 0, 0))
        check("map", d.cuMemMap(va2, SIZE, 0, imp2, 0))
        check("access", d.cuMemSetAccess(va2, SIZE, [access_desc(0)], 1))
        out["via_fd"] = check("read", d.memcpy_dtoh(va2 + 8 * ((src - 1) % wg.size), 8)).tolist()
        check("unmap", d.cuMemUnmap(va2, SIZE))
        check("free va", d.cuMemAddressFree(va2, SIZE))
        check("release", d.cuMemRelease(imp2))
        d.close_fd(got)
    wg.barrier()
    d.close_fd(fd)
    for v in (va, own_va):
        check("unmap", d.cuMemUnmap(v, SIZE))
        check("free va", d.cuMemAddressFree(v, SIZE))
    check("release", d.cuMemRelease(imp))
    check("release", d.cuMemRelease(h))
    wg.barrier()
    out["held"] = d.ledger.summary()
    return out


def test_legacy_ipc_same_host_and_across_trays():
    c = build_preset("gb200-nvl72:2")
    hosts = [h.name for h in c.hosts]
    placement = [GpuRef(hosts[0], 0), GpuRef(hosts[0], 1), GpuRef(hosts[1], 0)]
    threads = run_ranks_threads(legacy_ipc, c, placement)
    procs = run_ranks_procs(legacy_ipc, c, placement, timeout=20)
    assert procs == threads
    assert threads[0][1]["bytes"] == [1, 2, 0]                  # same host wrote; tray 1 could not
    assert threads[2][1]["open"].endswith("cudaErrorInvalidResourceHandle: 400>")   # row L8
    assert threads[1][1]["after_free"].endswith("cudaErrorInvalidResourceHandle: 400>")
    assert not leftover_segments(os.getpid())


def test_fabric_handles_across_trays_and_fds_within_a_host():
    c = build_preset("gb200-nvl72:2")
    hosts = [h.name for h in c.hosts]
    placement = [GpuRef(hosts[0], 0), GpuRef(hosts[0], 1), GpuRef(hosts[1], 0), GpuRef(hosts[1], 1)]
    threads = run_ranks_threads(fabric_and_fd, c, placement)
    procs = run_ranks_procs(fabric_and_fd, c, placement, timeout=20)
    assert procs == threads
    assert [v["seen"] for _, v in threads] == [[13] * 8, [10] * 8, [11] * 8, [12] * 8]
    assert [v["send"] for _, v in threads] == ["sent", "refused errno 110", "sent", "refused errno 110"]
    assert all(not v["held"] for _, v in threads)
    assert not leftover_segments(os.getpid())
