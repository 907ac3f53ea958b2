"""cuPointerGetAttribute as graph-buffer registration asks it (docs/lifecycle-rules.md):
RANGE_START_ADDR and RANGE_SIZE of the allocation holding a pointer, IS_LEGACY_CUDA_IPC_CAPABLE
1 for cudaMalloc memory and 0 for cuMem memory. Driver protocol only, so it runs on the
simulator and, with COMMSIM_DEVICE=cuda, on a GPU."""

from __future__ import annotations

from cuda.bindings import driver as cu

from commsim.driver import access_desc, alloc_prop, check

A = cu.CUpointer_attribute
MIB = 1 << 20


def attr(d, a, p):
    return check("cuPointerGetAttribute", d.cuPointerGetAttribute(a, p))


def test_range_of_a_cudamalloc_block_and_its_interior(rig_factory):
    rig = rig_factory("hgx-h100-8", [(0, 0)])
    d = rig[0]
    p = check("cudaMalloc", d.cudaMalloc(2 * MIB))
    try:
        for q in (p, p + 4096, p + 2 * MIB - 1):
            assert attr(d, A.CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, q) == p
            assert attr(d, A.CU_POINTER_ATTRIBUTE_RANGE_SIZE, q) >= 2 * MIB
            assert attr(d, A.CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE, q) == 1
    finally:
        check("cudaFree", d.cudaFree(p))


def test_cumem_memory_is_not_legacy_ipc_capable(rig_factory):
    rig = rig_factory("hgx-h100-8", [(0, 0)])
    d = rig[0]
    prop = alloc_prop(check("cudaGetDevice", d.cudaGetDevice()), 0)
    g = check("cuMemGetAllocationGranularity", d.cuMemGetAllocationGranularity(prop, 0))
    h = check("cuMemCreate", d.cuMemCreate(g, prop, 0))
    va = check("cuMemAddressReserve", d.cuMemAddressReserve(g, 0, 0, 0))
    try:
        check("cuMemMap", d.cuMemMap(va, g, 0, h, 0))
        check("cuMemSetAccess", d.cuMemSetAccess(va, g, [access_desc(check("cudaGetDevice", d.cudaGetDevice()))], 1))
        assert attr(d, A.CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE, va + 16) == 0
        assert attr(d, A.CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, va + 16) == va
        check("cuMemUnmap", d.cuMemUnmap(va, g))
    finally:
        d.cuMemAddressFree(va, g)
        d.cuMemRelease(h)
