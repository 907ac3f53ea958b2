"""cuda.bindings.runtime / cuda.bindings.driver as a hosted rank sees them.

Programs import cuda-python themselves and know nothing of commsim; the harness only
decides which simulated process each rank is. Machines: a 2-tray GB200 slice, an HGX H100
host and PCIe boxes without P2P.
"""

from __future__ import annotations

import ctypes
import inspect
import sys
import threading

import pytest

import cuda.bindings
from commsim.hosting.surfaces.cuda import bindings as cuda_bindings
from sim_ranks import module_surfaces, ranks, run, solo  # noqa: F401  (fixture)

pytestmark = pytest.mark.usefixtures("module_surfaces")

REAL_RT = cuda_bindings._real_runtime
REAL_CU = cuda_bindings._real_driver


def _check(res):
    from cuda.bindings import runtime as rt
    err, *rest = res
    if int(err) != 0:
        _, text = rt.cudaGetErrorString(rt.cudaError_t(int(err)))
        raise RuntimeError(f"CUDA error: {text.decode()}")
    return rest[0] if len(rest) == 1 else rest


# ---- the modules and their signatures ------------------------------------------------------

@pytest.mark.parametrize("module", [cuda_bindings.RUNTIME, cuda_bindings.DRIVER])
def test_every_simulated_function_has_the_real_parameter_names(module):
    real = cuda_bindings._REAL[module]
    names = cuda_bindings.simulated_functions()[module]
    assert len(names) > 20
    for n in names:
        mine = list(inspect.signature(getattr(cuda_bindings.standin(module), "_impl")[n]).parameters)
        theirs = list(inspect.signature(getattr(real, n)).parameters)
        assert mine == theirs, n


def test_imports_give_the_standins_and_outside_a_rank_the_real_functions():
    import cuda.bindings.runtime as rt1
    from cuda.bindings import driver as cu
    assert sys.modules["cuda.bindings.runtime"] is rt1 is cuda.bindings.runtime
    assert rt1 is not REAL_RT and cu is not REAL_CU
    # types, enums and constants are the binding's own objects
    assert rt1.cudaError_t is REAL_RT.cudaError_t and cu.CUmemFabricHandle is REAL_CU.CUmemFabricHandle
    assert rt1.cudaIpcMemLazyEnablePeerAccess == REAL_RT.cudaIpcMemLazyEnablePeerAccess
    # not a hosted rank: the real binding (the launcher's own threads)
    assert rt1.cudaMalloc is REAL_RT.cudaMalloc
    _, (r,) = ranks("hgx-h100-8", [(0, 0)])
    assert solo(r, lambda: rt1.cudaMalloc) is not REAL_RT.cudaMalloc
    seen = {}
    with __import__("commsim.hosting.state.session", fromlist=["bound"]).bound(r):
        t = threading.Thread(target=lambda: seen.setdefault("f", rt1.cudaMalloc))
        t.start()
        t.join()
    assert seen["f"] is REAL_RT.cudaMalloc       # another thread is not the rank


def test_install_nests_and_the_last_uninstall_restores_the_real_modules():
    standin = cuda_bindings.standin(cuda_bindings.RUNTIME)
    cuda_bindings.install()                 # a second, nested install (the bootstrap's)
    cuda_bindings.uninstall()
    assert sys.modules["cuda.bindings.runtime"] is standin
    cuda_bindings.SURFACE.patches.restore()     # what the outermost uninstall does
    try:
        assert sys.modules["cuda.bindings.runtime"] is REAL_RT and cuda.bindings.driver is REAL_CU
        import cuda.bindings.runtime as again
        assert again is REAL_RT
    finally:
        cuda_bindings._install(cuda_bindings.SURFACE.patches)
    assert sys.modules["cuda.bindings.runtime"] is standin and cuda.bindings.runtime is standin


def test_unsimulated_functions_and_attributes_fail_loudly_naming_themselves():
    _, (r,) = ranks("hgx-h100-8", [(0, 0)])

    def program():
        from cuda.bindings import driver as cu
        from cuda.bindings import runtime as rt
        with pytest.raises(NotImplementedError, match=r"cuda\.bindings\.runtime\.cudaGraphLaunch is not simulated"):
            rt.cudaGraphLaunch(None, None)
        with pytest.raises(NotImplementedError, match=r"cuda\.bindings\.driver\.cuLaunchKernel is not simulated"):
            cu.cuLaunchKernel(*[None] * 11)
        cu.cuInit(0)
        with pytest.raises(NotImplementedError, match="CU_DEVICE_ATTRIBUTE_TEXTURE_ALIGNMENT is not simulated"):
            cu.cuDeviceGetAttribute(cu.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_TEXTURE_ALIGNMENT, 0)
        with pytest.raises(AttributeError):
            rt.cuMemCreate              # driver API is not on the runtime module
        with pytest.raises(AttributeError):
            cu.no_such_name
    solo(r, program)


# ---- argument handling as the binding does it ----------------------------------------------

BAD_CALLS = [
    ("driver", "cuMemCreate", (1 << 21, "x", 0), {}),
    ("driver", "cuMemExportToShareableHandle", (1, 8, 0), {}),
    ("driver", "cuMemsetD8", (1, 300, 4), {}),
    ("driver", "cuMemsetD16", (1, 70000, 4), {}),
    ("driver", "cuMemAlloc", (), {"size": 4}),
    ("driver", "cuMemAlloc", (-1,), {}),
    ("driver", "cuDeviceGet", ("a",), {}),
    ("driver", "cuCtxSetCurrent", ("x",), {}),
    ("driver", "cuPointerGetAttribute", (11, 5), {}),
    ("driver", "cuMemSetAccess", (1, 1, [1], 1), {}),
    ("driver", "cuMemcpyHtoD", (1, "str", 4), {}),
    ("runtime", "cudaIpcCloseMemHandle", ("x",), {}),
    ("runtime", "cudaMalloc", ("x",), {}),
    ("runtime", "cudaSetDevice", ("x",), {}),
    ("runtime", "cudaIpcOpenMemHandle", (b"x" * 64, 1), {}),
    ("runtime", "cudaDeviceCanAccessPeer", (0, "x"), {}),
]


@pytest.mark.parametrize("module,name,args,kwargs", BAD_CALLS,
                         ids=[f"{c[1]}-{i}" for i, c in enumerate(BAD_CALLS)])
def test_a_wrong_argument_raises_what_the_real_binding_raises(module, name, args, kwargs):
    """The real binding checks arguments before it needs a driver, so the real exception is
    observable on this GPU-less machine; the hosted one must match it."""
    real = {"driver": REAL_CU, "runtime": REAL_RT}[module]
    with pytest.raises(Exception) as real_exc:
        getattr(real, name)(*args, **kwargs)
    _, (r,) = ranks("hgx-h100-8", [(0, 0)])

    def program():
        from cuda.bindings import driver as cu
        from cuda.bindings import runtime as rt
        cu.cuInit(0)
        rt.cudaSetDevice(0)
        with pytest.raises(Exception) as ours:
            getattr({"driver": cu, "runtime": rt}[module], name)(*args, **kwargs)
        return ours
    ours = solo(r, program)
    assert type(ours.value) is type(real_exc.value)
    assert str(ours.value) == str(real_exc.value)


def test_keyword_and_positional_calls_agree():
    _, (r,) = ranks("gb200-nvl72:1", [(0, 1)])

    def program():
        from cuda.bindings import driver as cu
        from cuda.bindings import runtime as rt
        _check(cu.cuInit(Flags=0))
        prop = cu.CUmemAllocationProp()
        prop.type = cu.CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED
        prop.location.type = cu.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
        prop.location.id = 1
        opt = cu.CUmemAllocationGranularity_flags.CU_MEM_ALLOC_GRANULARITY_RECOMMENDED
        g1 = _check(cu.cuMemGetAllocationGranularity(prop=prop, option=opt))
        g2 = _check(cu.cuMemGetAllocationGranularity(prop, opt))
        h = _check(cu.cuMemCreate(g1, prop, flags=0))
        p = _check(rt.cudaMalloc(size=4096))
        _check(rt.cudaMemset(devPtr=p, value=3, count=4096))
        return g1, g2, type(h), _check(cu.cuMemRelease(handle=h)), _check(rt.cudaFree(devPtr=p))
    g1, g2, htype, *_ = solo(r, program)
    assert g1 == g2 == 2 << 20 and htype is REAL_CU.CUmemGenericAllocationHandle


# ---- context and driver-API rules --------------------------------------------------------------

def test_driver_api_needs_cuInit_and_a_current_context():
    _, (r,) = ranks("gb200-nvl72:2", [(1, 3)], one_visible=True)

    def program():
        from cuda.bindings import driver as cu
        R = cu.CUresult
        before = cu.cuDeviceGetCount()[0]
        _check(cu.cuInit(0))
        count = _check(cu.cuDeviceGetCount())
        no_ctx = cu.cuCtxGetDevice()[0]
        cur0 = int(_check(cu.cuCtxGetCurrent()))
        dev = _check(cu.cuDeviceGet(0))
        bad = cu.cuDeviceGet(1)[0]               # one visible GPU: ordinal 1 does not exist
        ctx = _check(cu.cuDevicePrimaryCtxRetain(dev))
        _check(cu.cuCtxSetCurrent(ctx))
        got = _check(cu.cuCtxGetDevice())
        same = int(_check(cu.cuCtxGetCurrent())) == int(ctx)
        _check(cu.cuCtxSynchronize())
        _check(cu.cuCtxSetCurrent(None))
        unbound = cu.cuMemAlloc(16)[0]
        _check(cu.cuDevicePrimaryCtxRelease(dev))
        return (before, count, no_ctx, cur0, type(dev), bad, type(ctx), int(got), same, unbound,
                R)
    before, count, no_ctx, cur0, dtype, bad, ctype, got, same, unbound, R = solo(r, program)
    assert before == R.CUDA_ERROR_NOT_INITIALIZED
    assert count == 1 and no_ctx == R.CUDA_ERROR_INVALID_CONTEXT and cur0 == 0
    assert dtype is REAL_CU.CUdevice and ctype is REAL_CU.CUcontext
    assert bad == R.CUDA_ERROR_INVALID_DEVICE and got == 0 and same
    assert unbound == R.CUDA_ERROR_INVALID_CONTEXT


def test_runtime_use_makes_the_primary_context_current_and_devices_agree():
    _, (r,) = ranks("hgx-h100-8", [(0, 5)])

    def program():
        from cuda.bindings import driver as cu
        from cuda.bindings import runtime as rt
        _check(rt.cudaSetDevice(6))
        cu.cuInit(0)
        return (int(_check(cu.cuCtxGetDevice())), _check(rt.cudaGetDeviceCount()),
                _check(cu.cuDeviceGetName(64, 6)), _check(cu.cuDeviceTotalMem(6)),
                _check(rt.cudaDeviceGetAttribute(rt.cudaDeviceAttr.cudaDevAttrMultiProcessorCount, 6)),
                _check(rt.cudaGetDeviceProperties(6)))
    dev, n, name, total, sms, props = solo(r, program)
    assert (dev, n, name, total, sms) == (6, 8, b"NVIDIA H100 80GB HBM3", 80 << 30, 132)
    assert props.name.rstrip(b"\0") == name and (props.major, props.minor) == (9, 0)
    assert props.totalGlobalMem == total


# ---- memory ------------------------------------------------------------------------------------

def test_alloc_copy_memset_and_pointer_queries():
    _, (r,) = ranks("l40s-8-pcie", [(0, 2)])

    def program():
        from cuda.bindings import driver as cu
        from cuda.bindings import runtime as rt
        P = cu.CUpointer_attribute
        _check(cu.cuInit(0))
        _check(cu.cuCtxSetCurrent(_check(cu.cuDevicePrimaryCtxRetain(_check(cu.cuDeviceGet(2))))))
        p = _check(cu.cuMemAlloc(1024))
        src = (ctypes.c_uint32 * 4)(1, 2, 3, 4)
        _check(cu.cuMemcpyHtoD(p, ctypes.addressof(src), 16))          # int host address
        out = bytearray(16)
        _check(cu.cuMemcpyDtoH(out, p, 16))                            # buffer
        _check(cu.cuMemsetD16(int(p) + 16, 0x8000, 4))
        _check(cu.cuMemsetD32(int(p) + 32, 0x80000000, 2))
        _check(cu.cuMemsetD8(int(p) + 40, 7, 3))
        tail = bytearray(27)
        _check(cu.cuMemcpyDtoH(tail, int(p) + 16, 27))
        inner = cu.CUdeviceptr(int(p) + 100)
        base, size = _check(cu.cuMemGetAddressRange(inner))
        start = _check(cu.cuPointerGetAttribute(P.CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, inner))
        attrs = _check(cu.cuPointerGetAttributes(3, [P.CU_POINTER_ATTRIBUTE_RANGE_SIZE,
                                                    P.CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
                                                    P.CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE], inner))
        dev_attr = _check(rt.cudaPointerAttributes and rt.cudaPointerGetAttributes(int(p)))
        host_attr = _check(rt.cudaPointerGetAttributes(ctypes.addressof(src)))
        missing = cu.cuMemGetAddressRange(12345)[0]
        zero = cu.cuMemAlloc(0)[0]
        _check(cu.cuMemFree(p))
        double = cu.cuMemFree(p)[0]
        return (bytes(out), bytes(tail), int(base) == int(p), size, int(start) == int(p), attrs,
                dev_attr.type, dev_attr.device, host_attr.type, missing, zero, double)
    out, tail, b_ok, size, s_ok, attrs, dtype, ddev, htype, missing, zero, double = solo(r, program)
    assert out == bytes((ctypes.c_uint32 * 4)(1, 2, 3, 4))
    assert tail[:8] == b"\x00\x80" * 4 and tail[16:24] == b"\x00\x00\x00\x80" * 2
    assert tail[24:27] == b"\x07" * 3
    assert b_ok and s_ok and size == 1024 and attrs == [1024, 2, True]
    assert (int(dtype), ddev, int(htype)) == (2, 2, 0)    # device / unregistered host
    R = REAL_CU.CUresult
    assert (missing, zero, double) == (R.CUDA_ERROR_NOT_FOUND, R.CUDA_ERROR_INVALID_VALUE,
                                       R.CUDA_ERROR_INVALID_VALUE)
    assert r.events.first_error.api == "cuMemGetAddressRange"
    assert "test_cuda_bindings.py" in r.events.first_error.site


def test_copies_and_memsets_past_the_allocation_agree_and_build_nothing():
    _, (r,) = ranks("hgx-h100-8", [(0, 0)])

    def program():
        from cuda.bindings import driver as cu
        _check(cu.cuInit(0))
        _check(cu.cuCtxSetCurrent(_check(cu.cuDevicePrimaryCtxRetain(_check(cu.cuDeviceGet(0))))))
        p, q = _check(cu.cuMemAlloc(1 << 20)), _check(cu.cuMemAlloc(1 << 20))
        big = 1 << 40
        return ([cu.cuMemcpyHtoD(p, bytes(64), big)[0], cu.cuMemcpyDtoH(bytearray(64), p, big)[0],
                 cu.cuMemcpyDtoD(q, p, big)[0]],
                [f(p, 1, 1 << 32)[0] for f in (cu.cuMemsetD8, cu.cuMemsetD16, cu.cuMemsetD32)])
    copies, memsets = solo(r, program)
    R = REAL_CU.CUresult
    assert copies == [R.CUDA_ERROR_INVALID_VALUE] * 3         # unconfirmed.OUT_OF_RANGE_COPY
    assert memsets == [R.CUDA_ERROR_INVALID_VALUE] * 3
    assert r.events.first_error.api == "cuMemcpyHtoD"


# ---- legacy IPC: the seed's failure through cuda-python ------------------------------------------

def share_ipc(g, size=1 << 20):
    """cudaMalloc + cudaIpcGetMemHandle, bytes gathered, every peer opened (the handle
    object itself does not pickle in cuda-python 13, so real code sends its 64 bytes)."""
    from cuda.bindings import runtime as rt
    p = _check(rt.cudaMalloc(size))
    _check(rt.cudaMemset(p, g.rank + 1, size))
    h = _check(rt.cudaIpcGetMemHandle(p))
    blobs = g.all_gather_object(ctypes.string_at(h.getPtr(), 64), tag="handles")
    ptrs = []
    for i, b in enumerate(blobs):
        if i == g.rank:
            ptrs.append(p)
            continue
        peer = rt.cudaIpcMemHandle_t()
        ctypes.memmove(peer.getPtr(), b, 64)
        ptrs.append(_check(rt.cudaIpcOpenMemHandle(peer, rt.cudaIpcMemLazyEnablePeerAccess)))
    g.barrier(tag="opened")
    return ptrs


def close_ipc(g, ptrs):
    from cuda.bindings import runtime as rt
    for i, p in enumerate(ptrs):
        if i != g.rank:
            _check(rt.cudaIpcCloseMemHandle(p))
    g.barrier(tag="closed")
    _check(rt.cudaFree(ptrs[g.rank]))


def test_legacy_ipc_across_two_gb200_trays_is_invalid_resource_handle():
    fabric, rs = ranks("gb200-nvl72:2", [(0, 0), (1, 0)])
    outs = run(rs, share_ipc)
    for o, r in zip(outs, rs):
        assert str(o.error) == "CUDA error: invalid resource handle"
        e = r.events.first_error
        assert (e.api, e.code, e.name) == ("cudaIpcOpenMemHandle", 400, "cudaErrorInvalidResourceHandle")
        assert "share_ipc" in e.site


def test_legacy_ipc_within_one_host_reads_peer_bytes_and_closes_clean():
    fabric, rs = ranks("hgx-h100-8", [(0, 0), (0, 3), (0, 5)])

    def program(g):
        from cuda.bindings import runtime as rt
        ptrs = share_ipc(g, 4096)
        seen = []
        for p in ptrs:
            buf = bytearray(4)
            _check(rt.cudaMemcpy(buf, p, 4, rt.cudaMemcpyKind.cudaMemcpyDeviceToHost))
            seen.append(list(buf))
        close_ipc(g, ptrs)
        return seen

    for o in run(rs, program, seed=3):
        assert o.unwrap() == [[1] * 4, [2] * 4, [3] * 4]
    for r in rs:
        assert r.driver.ledger.summary() == {}
    assert not fabric.allocs


@pytest.mark.parametrize("spec", ["rtx4090-8", "l40s-8-pcie"])
def test_legacy_ipc_without_p2p_is_peer_access_unsupported(spec):
    _, rs = ranks(spec, [(0, 0), (0, 1)])
    for o in run(rs, share_ipc):
        assert str(o.error) == "CUDA error: peer access is not supported between these two devices"


def test_interleaved_ranks_each_see_their_own_process():
    _, rs = ranks("gb200-nvl72:2", [(0, 0), (1, 0)])

    def program(g):
        from cuda.bindings import runtime as rt
        for step in range(4):
            _check(rt.cudaMalloc(16))
            g.barrier(tag=f"step {step}")
        return rs[g.rank].driver.ledger.count("allocation")
    assert [o.unwrap() for o in run(rs, program, seed=9)] == [4, 4]


# ---- VMM with FABRIC handles across trays -----------------------------------------------------

def share_fabric(g, size=2 << 20):
    from cuda.bindings import driver as cu
    _check(cu.cuInit(0))
    dev = 0
    _check(cu.cuCtxSetCurrent(_check(cu.cuDevicePrimaryCtxRetain(_check(cu.cuDeviceGet(dev))))))
    prop = cu.CUmemAllocationProp()
    prop.type = cu.CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED
    prop.location.type = cu.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
    prop.location.id = dev
    prop.requestedHandleTypes = cu.CUmemAllocationHandleType.CU_MEM_HANDLE_TYPE_FABRIC
    h = _check(cu.cuMemCreate(size, prop, 0))
    fh = _check(cu.cuMemExportToShareableHandle(h, prop.requestedHandleTypes, 0))
    assert isinstance(fh, cu.CUmemFabricHandle) and len(fh.data) == 64
    datas = g.all_gather_object(fh.data, tag="fabric handles")
    base = _check(cu.cuMemAddressReserve(size * g.size, 0, 0, 0))
    desc = cu.CUmemAccessDesc()
    desc.location = prop.location
    desc.flags = cu.CUmemAccess_flags.CU_MEM_ACCESS_FLAGS_PROT_READWRITE
    handles = []
    for i, data in enumerate(datas):
        hi = h if i == g.rank else _check(cu.cuMemImportFromShareableHandle(data, prop.requestedHandleTypes))
        handles.append(hi)
        _check(cu.cuMemMap(int(base) + i * size, size, 0, hi, 0))
    _check(cu.cuMemSetAccess(base, size * g.size, [desc], 1))
    _check(cu.cuMemsetD32(int(base) + g.rank * size, 0x1000 + g.rank, 4))
    g.barrier(tag="written")
    seen = []
    for i in range(g.size):
        buf = (ctypes.c_uint32 * 1)()
        _check(cu.cuMemcpyDtoH(buf, int(base) + i * size, 4))
        seen.append(buf[0])
    legacy = _check(cu.cuPointerGetAttribute(
        cu.CUpointer_attribute.CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE, base))
    g.barrier(tag="read")
    for i, hi in enumerate(handles):
        _check(cu.cuMemUnmap(int(base) + i * size, size))
        _check(cu.cuMemRelease(hi))
    _check(cu.cuMemAddressFree(base, size * g.size))
    return seen, legacy


def test_fabric_handles_work_across_two_gb200_trays():
    fabric, rs = ranks("gb200-nvl72:2", [(0, 0), (1, 0)], one_visible=True)
    for o in run(rs, share_fabric):
        seen, legacy = o.unwrap()
        assert seen == [0x1000, 0x1001] and legacy is False
    for r in rs:
        assert r.driver.ledger.summary() == {}
    assert not fabric.allocs


def test_fabric_allocation_on_hgx_without_imex_is_not_permitted():
    _, rs = ranks("hgx-h100-8", [(0, 0), (0, 1)])
    for o, r in zip(run(rs, share_fabric), rs):
        assert str(o.error) == "CUDA error: operation not permitted"
        assert r.events.first_error.api == "cuMemCreate"


def test_the_standins_carry_the_real_spec_and_no_pre_13_name_is_added():
    """cuda-bindings 13.0.0 removed `cuda.cudart`/`cuda.cuda`/`cuda.nvrtc` (release notes,
    "Breaking changes"); FlashInfer picks its import branch by `find_spec("cuda.cudart")`, so
    the hosted answer must be the installed package's. `find_spec` of an imported module
    reads its `__spec__` (ValueError when None)."""
    import importlib.util
    for name in ("cuda.cudart", "cuda.cuda", "cuda.nvrtc"):
        assert importlib.util.find_spec(name) is None, name
    for name in (cuda_bindings.RUNTIME, cuda_bindings.DRIVER):
        standin, real = cuda_bindings.standin(name), cuda_bindings._REAL[name]
        assert sys.modules[name] is standin
        assert importlib.util.find_spec(name) is real.__spec__
        assert standin.__file__ == real.__file__ and standin.__package__ == "cuda.bindings"


def test_async_copy_and_set_complete_on_a_known_stream_and_refuse_a_stale_one():
    _, (r,) = ranks("hgx-h100-8", [(0, 0)])

    def body():
        from cuda.bindings import runtime as rt
        p = _check(rt.cudaMalloc(8))
        s = _check(rt.cudaStreamCreate())
        _check(rt.cudaMemsetAsync(p, 7, 8, s))
        buf = bytearray(8)
        _check(rt.cudaMemcpyAsync(buf, p, 8, rt.cudaMemcpyKind.cudaMemcpyDeviceToHost, s))
        _check(rt.cudaStreamSynchronize(s))
        _check(rt.cudaStreamDestroy(s))
        stale = rt.cudaMemsetAsync(p, 0, 8, s)[0]
        r.driver.cudaStreamBeginCapture(0, 0)      # a capture underway: refused loudly
        try:
            rt.cudaMemcpyAsync(buf, p, 8, rt.cudaMemcpyKind.cudaMemcpyDeviceToHost, 0)
            captured = "ran"
        except NotImplementedError as e:
            captured = str(e)
        r.driver.cudaStreamEndCapture(0)
        _check(rt.cudaFree(p))
        return list(buf), stale, captured

    got, stale, captured = solo(r, body)
    assert got == [7] * 8
    assert stale.name == "cudaErrorInvalidResourceHandle"
    assert "cudaMemcpyAsync inside a stream capture is not simulated" in captured
    assert r.driver.ledger.summary() == {}


def test_a_device_reset_destroys_streams_and_memory_and_keeps_the_primary_retain():
    """cudaDeviceReset (cuda_runtime_api.h: "all resources associated with the current device
    in the current process", streams and cudaMalloc memory named) and cuDevicePrimaryCtxReset
    (cuda.h: "resetting the primary context does not release it", so a later release is safe)."""
    _, (r,) = ranks("hgx-h100-8", [(0, 0)])

    def body():
        from cuda.bindings import driver as cu
        from cuda.bindings import runtime as rt
        p = _check(rt.cudaMalloc(8))
        s = _check(rt.cudaStreamCreate())
        _check(rt.cudaDeviceReset())
        after = (rt.cudaFree(p)[0], rt.cudaStreamSynchronize(s)[0])
        q = _check(rt.cudaMalloc(8))                 # the device reinitialises on next use
        _check(cu.cuInit(0))
        dev = _check(cu.cuDeviceGet(0))
        _check(cu.cuDevicePrimaryCtxRetain(dev))
        _check(cu.cuDevicePrimaryCtxReset(dev))
        freed = rt.cudaFree(q)[0]
        release = cu.cuDevicePrimaryCtxRelease(dev)[0]
        return after, freed, release, cu.cuDevicePrimaryCtxReset(99)[0]

    (free_err, sync_err), freed, release, bad = solo(r, body)
    assert free_err.name == "cudaErrorInvalidValue"
    assert sync_err.name == "cudaErrorInvalidResourceHandle"
    assert freed.name == "cudaErrorInvalidValue"
    assert release.name == "CUDA_SUCCESS" and bad.name == "CUDA_ERROR_INVALID_DEVICE"
