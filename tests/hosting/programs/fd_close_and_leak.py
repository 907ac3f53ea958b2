"""Exports two cuMem allocations as POSIX fds; closes one (os.close + cuMemRelease), keeps
the other open to exit: one leak, not two."""

import os

from cuda.bindings import driver as cu


def export():
    prop = cu.CUmemAllocationProp()
    prop.type = cu.CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED
    prop.location.type = cu.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
    prop.location.id = 0
    prop.requestedHandleTypes = cu.CUmemAllocationHandleType.CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
    err, h = cu.cuMemCreate(2 << 20, prop, 0)
    assert err == cu.CUresult.CUDA_SUCCESS, err
    err, fd = cu.cuMemExportToShareableHandle(h, prop.requestedHandleTypes, 0)
    assert err == cu.CUresult.CUDA_SUCCESS, err
    assert cu.cuMemRelease(h)[0] == cu.CUresult.CUDA_SUCCESS
    return fd


assert cu.cuInit(0)[0] == cu.CUresult.CUDA_SUCCESS
kept = export()        # never closed: the leak
closed = export()
os.close(closed)       # the program's last fd operation
print("exported", closed, kept)
