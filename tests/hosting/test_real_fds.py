"""POSIX-fd handles are real OS file descriptors.

The programs use cuda-python, `socket.send_fds`/`recv_fds` (SCM_RIGHTS), os.pidfd_open +
the pidfd_getfd syscall and os.close, as a serving stack's fd exchange does; the asserts
read the simulator's ledger and fabric.
"""

from __future__ import annotations

import ctypes
import os
import platform
import socket

import numpy as np
import pytest

from sim_ranks import module_surfaces, ranks, run, solo  # noqa: F401  (fixture)

pytestmark = pytest.mark.usefixtures("module_surfaces")

SIZE = 2 << 20


def _prop(cu, dev):
    p = cu.CUmemAllocationProp()
    p.type = cu.CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED
    p.location.type = cu.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
    p.location.id = dev
    p.requestedHandleTypes = cu.CUmemAllocationHandleType.CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
    return p


def export_fd():
    """cuMemCreate + export as a POSIX fd, the way symmetric-memory code does."""
    from cuda.bindings import driver as cu
    from cuda.bindings import runtime as rt
    assert cu.cuInit(0)[0] == cu.CUresult.CUDA_SUCCESS
    dev = rt.cudaGetDevice()[1]
    err, h = cu.cuMemCreate(SIZE, _prop(cu, dev), 0)
    assert err == cu.CUresult.CUDA_SUCCESS, err
    err, fd = cu.cuMemExportToShareableHandle(
        h, cu.CUmemAllocationHandleType.CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0)
    assert err == cu.CUresult.CUDA_SUCCESS, err
    return h, fd


def import_fd(fd):
    from cuda.bindings import driver as cu
    cu.cuInit(0)
    return cu.cuMemImportFromShareableHandle(
        fd, cu.CUmemAllocationHandleType.CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)


def _pidfd_getfd(pid: int, fd: int) -> int:
    nr = {"x86_64": 438, "aarch64": 438}[platform.machine()]     # same number on both
    libc = ctypes.CDLL(None, use_errno=True)
    pidfd = os.pidfd_open(pid)
    try:
        new = libc.syscall(nr, pidfd, fd, 0)
        if new < 0:
            raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()))
        return new
    finally:
        os.close(pidfd)


def test_export_gives_a_real_fd_and_os_close_releases_it():
    fabric, (r,) = ranks("hgx-h100-8", [(0, 0)])

    def program():
        from cuda.bindings import driver as cu
        h, fd = export_fd()
        assert isinstance(fd, int) and os.fstat(fd).st_size > 0      # a real descriptor
        held = r.driver.ledger.summary()
        os.close(fd)                                                  # the program's own close
        assert cu.cuMemRelease(h)[0] == cu.CUresult.CUDA_SUCCESS
        return held

    held = solo(r, program)
    assert held == {"vmm_handle": 1, "exported_fd": 1}
    # the closed fd was noticed: nothing held, the memory is gone
    assert r.driver.fd_target(0) is None
    assert r.driver.ledger.summary() == {} and not fabric.allocs
    assert fabric.exit_process(r.driver.proc.pid) == []


def test_an_fd_the_program_never_closes_is_a_leak_and_closed_at_exit():
    fabric, (r,) = ranks("hgx-h100-8", [(0, 2)])
    h, fd = solo(r, export_fd)
    from cuda.bindings import driver as cu
    solo(r, lambda: cu.cuMemRelease(h))
    assert fabric.allocs, "the open fd keeps the memory alive"
    leaks = fabric.exit_process(r.driver.proc.pid)
    assert len(leaks) == 1 and leaks[0].startswith("exported_fd")
    with pytest.raises(OSError):
        os.fstat(fd)                              # the OS closed it with the process
    assert not fabric.allocs


def test_fd_passes_over_a_real_unix_socket_and_maps_the_same_bytes():
    fabric, rs = ranks("hgx-h100-8", [(0, 0), (0, 1)])
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)

    def program(g):
        from cuda.bindings import driver as cu
        cu.cuInit(0)
        if g.rank == 0:
            h, fd = export_fd()
            cu.cuDevicePrimaryCtxRetain(cu.CUdevice(0))
            socket.send_fds(a, [b"fd"], [fd])                     # SCM_RIGHTS
            os.close(fd)
            g.barrier(tag="sent")
            g.barrier(tag="imported")
            return cu.cuMemRelease(h)[0]
        g.barrier(tag="sent")
        _, fds, _, _ = socket.recv_fds(b, 16, 1)
        (fd,) = fds
        err, h = import_fd(fd)
        os.close(fd)
        g.barrier(tag="imported")
        assert err == cu.CUresult.CUDA_SUCCESS, err
        return cu.cuMemRelease(h)[0]

    try:
        outs = run(rs, program)
    finally:
        a.close()
        b.close()
    from cuda.bindings import driver as cu
    assert [o.unwrap() for o in outs] == [cu.CUresult.CUDA_SUCCESS] * 2
    for r in rs:
        assert fabric.exit_process(r.driver.proc.pid) == []
    assert not fabric.allocs


def test_fd_taken_with_pidfd_getfd_imports():
    fabric, rs = ranks("hgx-h100-8", [(0, 3), (0, 4)])
    h, fd = solo(rs[0], export_fd)
    theirs = _pidfd_getfd(os.getpid(), fd)     # what a peer does with the exporter's pid
    err, h2 = solo(rs[1], lambda: import_fd(theirs))
    from cuda.bindings import driver as cu
    assert err == cu.CUresult.CUDA_SUCCESS
    assert rs[1].driver.ledger.summary() == {"imported_handle": 1, "exported_fd": 1}
    os.close(theirs)
    solo(rs[1], lambda: cu.cuMemRelease(h2))
    solo(rs[0], lambda: (os.close(fd), cu.cuMemRelease(h)))
    for r in rs:
        assert fabric.exit_process(r.driver.proc.pid) == []
    assert not fabric.allocs


def test_a_peer_fd_number_that_was_never_passed_does_not_import():
    """Row X4: the number alone means nothing in another process (in-process ranks share
    one OS fd table, so the simulator tells the two apart)."""
    fabric, rs = ranks("hgx-h100-8", [(0, 0), (0, 1)])
    h, fd = solo(rs[0], export_fd)
    from cuda.bindings import driver as cu
    err, _ = solo(rs[1], lambda: import_fd(fd))
    assert err == cu.CUresult.CUDA_ERROR_INVALID_VALUE
    assert rs[1].events.first_error.api == "cuMemImportFromShareableHandle"
    os.close(fd)
    solo(rs[0], lambda: cu.cuMemRelease(h))
    for r in rs:      # the close is noticed by the exit report at the latest
        assert fabric.exit_process(r.driver.proc.pid) == []
    assert not fabric.allocs


def test_an_fd_cannot_cross_simulated_hosts():
    fabric, rs = ranks("gb200-nvl72:2", [(0, 0), (1, 0)])
    h, fd = solo(rs[0], export_fd)
    dup = _pidfd_getfd(os.getpid(), fd)
    from cuda.bindings import driver as cu
    err, _ = solo(rs[1], lambda: import_fd(dup))
    os.close(dup)
    assert err == cu.CUresult.CUDA_ERROR_INVALID_VALUE
    assert any("never leave their host" in f for f in fabric.flags)


def test_garbage_fd_is_invalid_value_not_a_crash():
    fabric, (r,) = ranks("hgx-h100-8", [(0, 0)])
    rd, wr = os.pipe()
    from cuda.bindings import driver as cu
    try:
        for bad in (rd, 9999):
            assert solo(r, lambda: import_fd(bad))[0] == cu.CUresult.CUDA_ERROR_INVALID_VALUE
        # A negative fd never reaches the driver: cuda-python's argument conversion raises
        # TypeError for it (seen on the installed binding), and the surface does the same.
        with pytest.raises(TypeError):
            solo(r, lambda: import_fd(-1))
    finally:
        os.close(rd)
        os.close(wr)


# ---- process mode: real OS processes over ProcessFabrics -----------------------------------------

def fd_between_processes(wg, d):
    """Rank 0 exports a POSIX fd; rank 1 gets it over a real AF_UNIX socket (SCM_RIGHTS)
    and again with pidfd_getfd, imports both, writes through the mapping; rank 0 reads."""
    import secrets

    from commsim.driver import access_desc, alloc_prop, check
    from commsim.sim.driver import FD
    r = wg.rank
    srv = None
    name = None
    if r == 1:
        srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        name = f"\0commsim-fdtest-{os.getpid()}-{secrets.token_hex(8)}"   # abstract: no file
        srv.bind(name)
        srv.listen(1)
    out = {}
    h = fd = None
    if r == 0:
        h = check("cuMemCreate", d.cuMemCreate(SIZE, alloc_prop(0, FD), 0))
        fd = check("export", d.cuMemExportToShareableHandle(h, FD, 0))
    info = wg.all_gather_object((name, os.getpid(), fd))
    if r == 0:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as c:
            c.connect(info[1][0])
            socket.send_fds(c, [b"fd"], [fd])
    else:
        conn, _ = srv.accept()
        with conn:
            _, (got,), _, _ = socket.recv_fds(conn, 16, 1)
        taken = _pidfd_getfd(info[0][1], info[0][2])
        handles = [check("import", d.cuMemImportFromShareableHandle(x, FD)) for x in (got, taken)]
        out["fds_differ"] = len({got, taken, info[0][2]}) == 3
        for x in (got, taken):
            os.close(x)
        va = check("reserve", d.cuMemAddressReserve(SIZE, 0, 0, 0))
        check("map", d.cuMemMap(va, SIZE, 0, handles[1], 0))
        check("access", d.cuMemSetAccess(va, SIZE, [access_desc(0)], 1))
        check("write", d.memcpy_htod(va, np.full(8, 0xAB, np.uint8)))
        check("unmap", d.cuMemUnmap(va, SIZE))
        check("free va", d.cuMemAddressFree(va, SIZE))
        for hh in handles:
            check("release", d.cuMemRelease(hh))
        srv.close()
    wg.barrier()
    if r == 0:
        va = check("reserve", d.cuMemAddressReserve(SIZE, 0, 0, 0))
        check("map", d.cuMemMap(va, SIZE, 0, h, 0))
        check("access", d.cuMemSetAccess(va, SIZE, [access_desc(0)], 1))
        out["seen"] = check("read", d.memcpy_dtoh(va, 8)).tolist()
        check("unmap", d.cuMemUnmap(va, SIZE))
        check("free va", d.cuMemAddressFree(va, SIZE))
        os.close(fd)
        check("release", d.cuMemRelease(h))
    wg.barrier()
    d._fds.reap()
    out["held"] = d.ledger.summary()
    return out


def test_fds_pass_between_real_processes_in_process_mode():
    from commsim.procs.launcher import run_ranks_procs
    from commsim.sim import shm
    from commsim.topology import GpuRef, build_preset
    c = build_preset("hgx-h100-8")
    placement = [GpuRef(c.hosts[0].name, 0), GpuRef(c.hosts[0].name, 1)]
    got = run_ranks_procs(fd_between_processes, c, placement, timeout=60)
    assert got[0] == ("ok", {"seen": [0xAB] * 8, "held": {}}), got
    assert got[1] == ("ok", {"fds_differ": True, "held": {}}), got
    assert not shm.segments(f"{shm.PREFIX_HEAD}{os.getpid()}")      # nothing left in /dev/shm


def test_closing_the_fd_frees_the_memory_at_once():
    """Release + os.close drops the last reference: torch.cuda's and NVML's
    memory counts see the bytes free without any other fd call in between."""
    _, (r,) = ranks("l40s-8-pcie", [(0, 3)])

    def program():
        import pynvml
        import torch
        from cuda.bindings import driver as cu
        h, fd = export_fd()
        held = torch.cuda.mem_get_info(3)
        assert cu.cuMemRelease(h)[0] == cu.CUresult.CUDA_SUCCESS
        os.close(fd)
        free, total = torch.cuda.mem_get_info(3)
        pynvml.nvmlInit()
        nv = pynvml.nvmlDeviceGetMemoryInfo(pynvml.nvmlDeviceGetHandleByIndex(3)).used
        pynvml.nvmlShutdown()
        return total - held[0], total - free, nv
    assert solo(r, program) == (SIZE, 0, 0)
    assert r.driver.ledger.summary() == {}
