"""Regressions: the simulated driver answers adversarial
arguments as the real binding does (an exception only where cuda-python's conversion raises
one, otherwise a CUDA error code), and its ledger stays true where it lied."""

from __future__ import annotations

import math
import os
from types import SimpleNamespace

import numpy as np
import pytest

from commsim.driver import access_desc, alloc_prop, check, multicast_prop
from commsim.sim import SimFabric, shm, spawn_driver
from commsim.sim.driver import FD, E, R
from commsim.sim.process_fabric import ProcessFabric
from commsim.driver import FdTransportError
from commsim.sim.fd_channel import pass_fd
from commsim.topology import GpuRef, build_preset

GRAN = 2 << 20


def pair(preset: str = "hgx-h100-8"):
    c = build_preset(preset)
    refs = list(c.gpu_refs())
    fab = SimFabric(c, 0)
    return fab, spawn_driver(fab, refs[0]), spawn_driver(fab, refs[1])


def test_cudamalloc_converts_its_size_as_the_binding_does():
    _, d, _ = pair()
    with pytest.raises(TypeError):
        d.cudaMalloc("4096")                # cuda-python: "an integer is required"
    with pytest.raises(OverflowError):
        d.cudaMalloc(math.inf)
    with pytest.raises(ValueError):
        d.cudaMalloc(math.nan)
    with pytest.raises(OverflowError):
        d.cudaMalloc(-1)
    err, ptr = d.cudaMalloc(4096.7)         # converts to 4096, as the binding does
    assert err == E.cudaSuccess and d.ledger.count("allocation") == 1
    assert d.cudaMalloc(2 ** 63)[0] == E.cudaErrorMemoryAllocation   # converts, cannot fit
    check("cudaFree", d.cudaFree(ptr))
    assert d.ledger.count() == 0


def test_garbage_that_converts_gets_codes_not_exceptions():
    _, d, _ = pair()
    assert d.cudaSetDevice(-7)[0] == E.cudaErrorInvalidDevice
    assert d.cudaFree(1.5)[0] == E.cudaErrorInvalidValue
    assert d.cuDeviceGetAttribute("99999", 0)[0] == R.CUDA_ERROR_INVALID_VALUE
    assert d.memcpy_htod(0, np.array([object()]))[0] == E.cudaErrorInvalidValue
    assert d.memcpy_htod(0, "abc")[0] == E.cudaErrorInvalidValue
    assert d.nvmlDeviceGetP2PStatus(math.inf, 0)[0] == 2      # NVML_ERROR_INVALID_ARGUMENT
    duck = SimpleNamespace(numDevices=math.inf, size=GRAN, handleTypes=0)
    assert d.cuMulticastCreate(duck)[0] == R.CUDA_ERROR_INVALID_VALUE
    assert d.cuMulticastCreate(multicast_prop(2 ** 31, GRAN))[0] == R.CUDA_ERROR_INVALID_VALUE
    assert d.ledger.count() == 0


@pytest.mark.parametrize("fd", [[], "3", 1.5, None, 2 ** 70])
def test_close_fd_refuses_what_os_close_refuses(fd):
    _, d, _ = pair()
    with pytest.raises(Exception) as real:
        os.close(fd)                        # refused before any syscall: safe to call
    with pytest.raises(type(real.value)):
        d.close_fd(fd)
    assert d.close_fd(12345) == -1          # an integer that is no open fd: EBADF


def test_a_forged_process_mode_handle_naming_gpu_65535_names_nothing():
    c = build_preset("hgx-h100-8")
    refs = list(c.gpu_refs())[:2]
    prefix = shm.new_prefix()
    try:
        exp = ProcessFabric(c, 0, 0, refs, prefix)
        imp = ProcessFabric(c, 0, 1, refs, prefix)
        de, di = spawn_driver(exp, refs[0]), spawn_driver(imp, refs[1])
        ptr = check("cudaMalloc", de.cudaMalloc(4096))
        good = check("cudaIpcGetMemHandle", de.cudaIpcGetMemHandle(ptr))
        a = exp.allocs[next(iter(exp.allocs))]
        forged = exp._seal(b"CSIPCMEM", a.aid, de.proc.pid, GpuRef(refs[0].host, 65535), a.size)
        assert di.cudaIpcOpenMemHandle(forged, 1)[0] == E.cudaErrorInvalidResourceHandle
        # ... and nothing was cached from it: the real handle still opens
        p = check("cudaIpcOpenMemHandle", di.cudaIpcOpenMemHandle(good, 1))
        check("close", di.cudaIpcCloseMemHandle(p))
        check("free", de.cudaFree(ptr))
        assert imp.exit_process(di.proc.pid) == [] and exp.exit_process(de.proc.pid) == []
    finally:
        shm.sweep(prefix)


def test_releasing_a_multicast_handle_while_bound_leaves_no_ledger_entry():
    fab, d, _ = pair()
    dev = check("dev", d.cudaGetDevice())
    mc = check("mc", d.cuMulticastCreate(multicast_prop(1, GRAN)))
    check("add", d.cuMulticastAddDevice(mc, dev))
    mem = check("create", d.cuMemCreate(GRAN, alloc_prop(dev), 0))
    check("bind", d.cuMulticastBindMem(mc, 0, mem, 0, GRAN, 0))
    check("release mc", d.cuMemRelease(mc))          # while memory is still bound
    assert d.ledger.count("multicast_binding") == 0, d.ledger.report()
    check("release mem", d.cuMemRelease(mem))
    assert d.ledger.count() == 0 and not fab.allocs and not fab.multicasts
    assert fab.exit_process(d.proc.pid) == []


def test_pass_fd_to_an_exited_process_takes_no_reference():
    fab, src, dst = pair()
    dev = check("dev", src.cudaGetDevice())
    h = check("create", src.cuMemCreate(GRAN, alloc_prop(dev, FD), 0))
    fd = check("export", src.cuMemExportToShareableHandle(h, FD, 0))
    fab.exit_process(dst.proc.pid)
    with pytest.raises(FdTransportError):
        pass_fd(src, fd, dst)
    assert src.close_fd(fd) == 0
    check("release", src.cuMemRelease(h))
    assert not fab.allocs, "the physical allocation leaked"
    assert fab.exit_process(src.proc.pid) == []


def test_memset_checks_its_range_before_building_anything():
    import tracemalloc
    _, d, _ = pair()
    p = check("malloc", d.cudaMalloc(1 << 20))
    tracemalloc.start()
    try:
        for width in (1, 2, 4):
            for n in (1 << 32, (1 << 64) - 1, (1 << 20) // width + 1):
                assert d.memset_d(p, 0xAB, n, width) == (E.cudaErrorInvalidValue,)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20, f"a refused memset built {peak} bytes"
    assert d.memset_d(p + 8, 0xBEEF, 3, 2) == (E.cudaSuccess,)      # in range: written
    assert d.memset_d(p + (1 << 20) - 4, 0x01020304, 1, 4) == (E.cudaSuccess,)
    assert d.memset_d(p, 0x11, 0, 4) == (E.cudaSuccess,)              # nothing to do
    out = check("dtoh", d.memcpy_dtoh(p, 1 << 20))
    assert bytes(out[8:14]) == b"\xef\xbe" * 3 and bytes(out[-4:]) == b"\x04\x03\x02\x01"
    assert not out[:8].any() and not out[14:-4].any()


def test_a_copy_past_the_allocation_is_refused_alike_in_every_direction():
    _, d, _ = pair()
    p = check("malloc", d.cudaMalloc(1 << 20))
    q = check("malloc", d.cudaMalloc(1 << 20))
    big = 1 << 40
    assert d.copy_range(p, big) == (E.cudaErrorInvalidValue,)         # what HtoD checks first
    assert d.memcpy_dtoh(p, big)[0] == E.cudaErrorInvalidValue
    assert d.cudaMemcpy(q, p, big, 3)[0] == E.cudaErrorInvalidValue
    assert d.copy_range(p, 1 << 20) == (E.cudaSuccess,)
    assert d.copy_range(p + 1, 1 << 20) == (E.cudaErrorInvalidValue,)


def test_an_exited_process_fd_channel_fails_as_closed_not_with_a_runtime_error():
    from commsim.sim.fd_channel import SimFdChannel
    fab, src, dst = pair()
    dev = check("dev", src.cudaGetDevice())
    h = check("create", src.cuMemCreate(GRAN, alloc_prop(dev, FD), 0))
    fd = check("export", src.cuMemExportToShareableHandle(h, FD, 0))
    fab.exit_process(dst.proc.pid)
    for call in (lambda: SimFdChannel(dst).pull(src.proc.pid, fd),
                 lambda: SimFdChannel(dst).receive(src.proc.pid, 0),
                 lambda: SimFdChannel(dst).send(fd, src.proc.pid)):
        with pytest.raises(FdTransportError, match="EBADF.*has exited") as e:
            call()
        assert e.value.errno == 9
    assert src.close_fd(fd) == 0
    check("release", src.cuMemRelease(h))
    assert not fab.allocs
