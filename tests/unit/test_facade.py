"""commsim.facade: unchanged cuda-python and ctypes-cudart code runs on simulated processes.

The two snippets below are written the way serving stacks write them (they import CUDA
themselves and know nothing of commsim); the test only decides which simulated process each
rank is, with `patched(driver)`, and runs the ranks under the group layer's Scheduler.
"""

from __future__ import annotations

import ctypes
import sys

import numpy as np
import pytest

import cuda.bindings
import cuda.bindings.driver as real_driver
import cuda.bindings.runtime as real_runtime
from commsim.facade import CudaModule, CudaRTLibrary, Facade, current_facade, patched
from commsim.group.local import LocalWorld
from commsim.sim import SimFabric, spawn_driver
from commsim.topology.model import GpuRef
from commsim.topology.presets import build


# ---- the snippets under test (no commsim import inside them but the wrapper class) --------

def create_shared_buffer_ctypes(size_in_bytes, group):
    """The shape of FlashInfer's comm/cuda_ipc.py create_shared_buffer: ctypes libcudart
    wrapper, handle bytes exchanged over the CPU group, each peer's handle opened."""
    lib = CudaRTLibrary()                   # the wrapper over "libcudart" of this process
    pointer = lib.cudaMalloc(size_in_bytes)
    handle = lib.cudaIpcGetMemHandle(pointer)
    world_size, rank = group.size, group.rank
    handle_bytes = ctypes.string_at(ctypes.addressof(handle), ctypes.sizeof(handle))
    gathered = group.all_gather_object(handle_bytes, tag="create_shared_buffer: handles")
    handles = []
    handle_type = type(handle)
    for data in gathered:
        h = handle_type()
        ctypes.memmove(ctypes.addressof(h), data, len(data))
        handles.append(h)
    pointers = []
    for i, h in enumerate(handles):
        if i == rank:
            pointers.append(pointer.value)
        else:
            pointers.append(lib.cudaIpcOpenMemHandle(h).value)
    group.barrier(tag="create_shared_buffer: opened")
    assert len(pointers) == world_size
    return pointers


def free_shared_buffer_ctypes(pointers, group):
    lib = CudaRTLibrary()
    rank = group.rank
    for i, p in enumerate(pointers):
        if i != rank:
            lib.cudaIpcCloseMemHandle(ctypes.c_void_p(p))
    group.barrier(tag="free_shared_buffer: closed")     # close before free (§7.3, row G7)
    lib.cudaFree(ctypes.c_void_p(pointers[rank]))


def _cuda_check(result):
    from cuda.bindings import runtime as cudart
    err, *rest = result
    if err != cudart.cudaError_t.cudaSuccess:
        _, text = cudart.cudaGetErrorString(err)
        raise RuntimeError(f"CUDART error: {text.decode()}")
    return rest[0] if len(rest) == 1 else rest


def create_shared_buffer_cuda_python(size_in_bytes, group):
    """The same exchange written against cuda-python."""
    import cuda.bindings.runtime as cudart
    ptr = _cuda_check(cudart.cudaMalloc(size_in_bytes))
    _cuda_check(cudart.cudaMemset(ptr, group.rank + 1, size_in_bytes))
    handle = _cuda_check(cudart.cudaIpcGetMemHandle(ptr))
    handles = group.all_gather_object(handle, tag="cuda-python: handles")
    out = []
    for i, h in enumerate(handles):
        if i == group.rank:
            out.append(ptr)
        else:
            out.append(_cuda_check(cudart.cudaIpcOpenMemHandle(
                h, cudart.cudaIpcMemLazyEnablePeerAccess)))
    group.barrier(tag="cuda-python: opened")
    return out


def free_shared_buffer_cuda_python(pointers, group):
    from cuda.bindings import runtime as cudart
    for i, p in enumerate(pointers):
        if i != group.rank:
            _cuda_check(cudart.cudaIpcCloseMemHandle(p))
    group.barrier(tag="cuda-python: closed")
    _cuda_check(cudart.cudaFree(pointers[group.rank]))


# ---- harness ---------------------------------------------------------------------------------

def _drivers(spec, refs):
    c = build(spec)
    fabric = SimFabric(c)
    return fabric, [spawn_driver(fabric, GpuRef(c.hosts[h].name, g)) for h, g in refs]


def _run(drivers, body, seed=0):
    world = LocalWorld(len(drivers), seed=seed)

    def rank(group):
        with patched(drivers[group.rank]):
            return body(group)

    return world.run(rank)


TWO_TRAYS = [(0, 0), (1, 0)]
ONE_TRAY = [(0, 0), (0, 1)]
SNIPPETS = [(create_shared_buffer_ctypes, free_shared_buffer_ctypes),
            (create_shared_buffer_cuda_python, free_shared_buffer_cuda_python)]


@pytest.mark.parametrize("create,free", SNIPPETS, ids=["ctypes-cudart", "cuda-python"])
def test_across_two_gb200_trays_the_open_fails_like_flashinfer_2006(create, free):
    fabric, drivers = _drivers("gb200-nvl72:2", TWO_TRAYS)
    assert drivers[0].gethostname() != drivers[1].gethostname()
    outs = _run(drivers, lambda g: create(2 << 20, g))
    for o in outs:
        assert isinstance(o.error, RuntimeError), o
        assert str(o.error) == "CUDART error: invalid resource handle"
    # create_shared_buffer raised after its cudaMalloc: each rank still holds its block
    for d in drivers:
        assert d.ledger.summary() == {"allocation": 1}
        (item,) = list(d.ledger)
        assert "test_facade.py" in item.site     # the call site is the snippet, not the facade
        (ptr,) = [it.key for it in d.ledger]
        assert int(d.cudaFree(ptr)[0]) == 0
    assert not fabric.allocs and not fabric.flags


@pytest.mark.parametrize("create,free", SNIPPETS, ids=["ctypes-cudart", "cuda-python"])
def test_within_one_tray_it_succeeds_and_closes_clean(create, free):
    fabric, drivers = _drivers("gb200-nvl72:2", ONE_TRAY)

    def body(g):
        ptrs = create(1 << 16, g)
        held = drivers[g.rank].ledger.summary()
        free(ptrs, g)
        return ptrs, held

    outs = _run(drivers, body, seed=5)
    for r, o in enumerate(outs):
        ptrs, held = o.unwrap()
        assert held == {"allocation": 1, "ipc_mapping": 1}
        assert len(ptrs) == 2 and len(set(ptrs)) == 2
    for d in drivers:
        assert d.ledger.summary() == {}
    assert not fabric.allocs and not fabric.flags


def test_peer_bytes_are_visible_through_the_cuda_python_snippet():
    fabric, drivers = _drivers("hgx-h100-8", [(0, 0), (0, 3), (0, 5)])

    def body(g):
        ptrs = create_shared_buffer_cuda_python(4096, g)
        seen = [drivers[g.rank].memcpy_dtoh(p, 8)[1].tolist() for p in ptrs]
        free_shared_buffer_cuda_python(ptrs, g)
        return seen

    for o in _run(drivers, body, seed=2):
        assert o.unwrap() == [[r + 1] * 8 for r in range(3)]
    assert not fabric.allocs


# ---- the patching itself ---------------------------------------------------------------------

def _plain_import():
    import cuda.bindings.driver
    import cuda.bindings.runtime
    return cuda.bindings


def test_imports_resolve_to_the_facade_and_are_restored():
    _, (d,) = _drivers("gb200-nvl72:1", [(0, 2)])
    before = (sys.modules["cuda.bindings.runtime"], sys.modules["cuda.bindings.driver"],
              cuda.bindings.runtime, cuda.bindings.driver)
    assert before == (real_runtime, real_driver, real_runtime, real_driver)
    with patched(d) as f:
        assert isinstance(f, Facade) and current_facade() is f
        import cuda.bindings.runtime as rt1
        from cuda.bindings import runtime as rt2
        from cuda.bindings import driver as cu
        plain = _plain_import()     # `import cuda.bindings.runtime` then attribute lookups
        for rt in (rt1, rt2, plain.runtime):
            assert rt.cudaGetDevice() == (real_runtime.cudaError_t.cudaSuccess, 2)
            assert rt.cudaError_t is real_runtime.cudaError_t
            assert rt.cudaMemcpyKind is real_runtime.cudaMemcpyKind
            assert rt.cudaIpcMemLazyEnablePeerAccess == real_runtime.cudaIpcMemLazyEnablePeerAccess
            assert rt.cudaGetErrorString(rt.cudaError_t(217))[1] == \
                b"peer access is not supported between these two devices"
            assert rt.cudaGetErrorName(rt.cudaError_t(400))[1] == b"cudaErrorInvalidResourceHandle"
        assert cu.CUresult is real_driver.CUresult and cu.CUmemAllocationProp is real_driver.CUmemAllocationProp
        assert plain.driver.cuDeviceCanAccessPeer(2, 3) == (cu.CUresult.CUDA_SUCCESS, 1)
        assert cu.cuGetErrorString(cu.CUresult.CUDA_ERROR_NOT_PERMITTED)[1] == b"operation not permitted"
        assert cu.cuGetErrorName(cu.CUresult(800))[1] == b"CUDA_ERROR_NOT_PERMITTED"
        with pytest.raises(NotImplementedError, match="cudaStreamCreate is not simulated"):
            rt1.cudaStreamCreate()
        with pytest.raises(AttributeError):
            rt1.cuMemCreate      # driver API is not on the runtime module, as in cuda-python
        with pytest.raises(AttributeError):
            rt1.no_such_name
    after = (sys.modules["cuda.bindings.runtime"], sys.modules["cuda.bindings.driver"],
             cuda.bindings.runtime, cuda.bindings.driver)
    assert after == before and current_facade() is None


def test_restored_after_an_exception():
    _, (d,) = _drivers("hgx-h100-8", [(0, 0)])
    with pytest.raises(ZeroDivisionError):
        with patched(d):
            1 / 0
    assert sys.modules["cuda.bindings.runtime"] is real_runtime
    assert cuda.bindings.runtime is real_runtime


def test_interleaved_ranks_each_see_their_own_process():
    """Greenlet-aware: two ranks sit inside their own patched() across collectives."""
    _, drivers = _drivers("gb200-nvl72:2", TWO_TRAYS)

    def body(g):
        seen = []
        for step in range(4):
            import cuda.bindings.runtime as rt
            seen.append(rt.cudaMalloc(16)[1] is not None and
                        current_facade().process is drivers[g.rank])
            g.barrier(tag=f"step {step}")
        return seen, drivers[g.rank].ledger.count("allocation")

    outs = _run(drivers, body, seed=9)
    for r, o in enumerate(outs):
        seen, n = o.unwrap()
        assert all(seen) and n == 4
        assert drivers[1 - r].ledger.count("allocation") == 4
    assert sys.modules["cuda.bindings.runtime"] is real_runtime


def test_ranks_started_inside_a_block_inherit_it_and_other_threads_do_not():
    import threading
    _, (d,) = _drivers("hgx-h100-8", [(0, 4)])
    seen = {}
    with patched(d):
        world = LocalWorld(2, seed=0)
        outs = world.run(lambda g: __import__("cuda.bindings.runtime").bindings.runtime.cudaGetDevice()[1])
        assert [o.unwrap() for o in outs] == [4, 4]
        t = threading.Thread(target=lambda: seen.setdefault("f", current_facade()))
        t.start()
        t.join()
    assert seen["f"] is None


def test_cudart_library_surface():
    _, drivers = _drivers("gb200-nvl72:1", [(0, 0), (0, 1)])
    a, b = CudaRTLibrary(drivers[0]), CudaRTLibrary(drivers[1])
    with pytest.raises(RuntimeError, match="outside commsim.facade.patched"):
        CudaRTLibrary()
    p = a.cudaMalloc(4096)
    assert isinstance(p, ctypes.c_void_p) and p.value
    a.cudaMemset(p, 7, 4096)
    q = a.cudaMalloc(4096)
    a.cudaMemcpy(q, p, 4096)
    a.cudaDeviceSynchronize()
    assert drivers[0].memcpy_dtoh(q.value, 4)[1].tolist() == [7] * 4
    h = a.cudaIpcGetMemHandle(p)
    assert ctypes.sizeof(h) == 128
    with pytest.raises(RuntimeError, match="^CUDART error: invalid device context$"):
        a.cudaIpcOpenMemHandle(h)                  # row L9: own handle
    r = b.cudaIpcOpenMemHandle(h)
    assert np.array_equal(drivers[1].memcpy_dtoh(r.value, 4)[1], [7] * 4)
    b.cudaIpcCloseMemHandle(r)
    with pytest.raises(RuntimeError, match="^CUDART error: invalid argument$"):
        b.cudaIpcCloseMemHandle(r)
    with pytest.raises(RuntimeError, match="^CUDART error: invalid device ordinal$"):
        a.cudaSetDevice(9)
    a.cudaSetDevice(3)
    assert a.cudaGetDevice() == 3
    a.cudaFree(p)
    a.cudaFree(q)
    assert drivers[0].ledger.summary() == {} and drivers[1].ledger.summary() == {}


def test_facade_modules_list_only_their_own_api():
    _, (d,) = _drivers("hgx-h100-8", [(0, 0)])
    f = Facade(d)
    assert isinstance(f.runtime, CudaModule) and f.runtime.__name__ == "cuda.bindings.runtime"
    assert f.runtime.cudaIpcOpenMemHandle == d.cudaIpcOpenMemHandle
    assert f.driver.cuMemCreate == d.cuMemCreate and f.driver.cuMulticastCreate == d.cuMulticastCreate
    assert "cudaMalloc" in dir(f.runtime) and "cudaMalloc" not in f.driver.__dict__
