"""`cuda.bindings.driver` VMM and multicast calls for a hosted rank (cuda-python 13.x).

The same contract as driver_api.py (real parameter names, the binding's conversions and
return types): `cuMemCreate` gives a `CUmemGenericAllocationHandle`,
`cuMemExportToShareableHandle` a `CUmemFabricHandle` for FABRIC and an int fd for POSIX-fd
(cuda-python's _HelperCUmemAllocationHandleType.pyObj), and `cuMemImportFromShareableHandle`
takes what the binding takes: for FABRIC a buffer holding the 64 bytes (e.g. `.data`) or its
address, for POSIX-fd the fd itself (cuda.h: the fd travels as `(void*)(uintptr_t)fd`).
"""

from __future__ import annotations

import ctypes
from typing import Any

from cuda.bindings import driver as cu

from commsim.driver import FABRIC_HANDLE_SIZE
from commsim.hosting.surfaces.cuda.driver_api import FABRIC, FD, R, _drv, _host_read, _host_source, _ok, driver_api
from commsim.hosting.state.cuda_state import (ApiFail, buffer_address, c_int, check_struct, devptr, enum_attr_value,
                         enum_value, handle_value)

_Err = ApiFail


# ---- VMM -----------------------------------------------------------------------------------------

def _handle(x: Any) -> int:
    return handle_value(cu.CUmemGenericAllocationHandle, x)


@driver_api(1)
def cuMemGetAllocationGranularity(prop, option):
    check_struct(prop, cu.CUmemAllocationProp, "prop")
    return _drv().cuMemGetAllocationGranularity(prop, enum_value(option))


@driver_api(1)
def cuMemCreate(size, prop, flags):
    check_struct(prop, cu.CUmemAllocationProp, "prop")
    h = _ok(_drv().cuMemCreate(c_int(size, "size_t"), prop, c_int(flags, "unsigned long long")))
    return (R.CUDA_SUCCESS, cu.CUmemGenericAllocationHandle(h))


@driver_api(1)
def cuMemExportToShareableHandle(handle, handleType, flags):
    t = enum_attr_value(handleType)           # the binding reads handleType.value
    h = _handle(handle)
    out = _ok(_drv().cuMemExportToShareableHandle(h, t, c_int(flags, "unsigned long long")))
    if t == FABRIC:
        fh = cu.CUmemFabricHandle()
        fh.data = bytes(out)[:FABRIC_HANDLE_SIZE]
        return (R.CUDA_SUCCESS, fh)
    return (R.CUDA_SUCCESS, int(out))          # POSIX fd: an int (the binding's pyObj)


@driver_api(1)
def cuMemImportFromShareableHandle(osHandle, shHandleType):
    t = enum_value(shHandleType)
    if t == FABRIC:
        # osHandle points at the 64-byte CUmemFabricHandle: a buffer, or its address.
        if isinstance(osHandle, int):
            key = ctypes.string_at(osHandle, FABRIC_HANDLE_SIZE) if osHandle else b""
        elif osHandle is None:
            raise _Err(R.CUDA_ERROR_INVALID_VALUE)
        else:
            key = _host_read(_host_source(osHandle), FABRIC_HANDLE_SIZE)
        os_handle: Any = key
    elif t == FD:
        # The fd travels in the pointer value itself, `(void*)(uintptr_t)fd` (cuda.h).
        os_handle = osHandle if isinstance(osHandle, int) else (buffer_address(osHandle)[0]
                                                                if osHandle is not None else 0)
    else:
        os_handle = osHandle
    h = _ok(_drv().cuMemImportFromShareableHandle(os_handle, t))
    return (R.CUDA_SUCCESS, cu.CUmemGenericAllocationHandle(h))


@driver_api(1)
def cuMemAddressReserve(size, alignment, addr, flags):
    p = _ok(_drv().cuMemAddressReserve(c_int(size, "size_t"), c_int(alignment, "size_t"),
                                       devptr(addr), c_int(flags, "unsigned long long")))
    return (R.CUDA_SUCCESS, cu.CUdeviceptr(p))


@driver_api(0)
def cuMemMap(ptr, size, offset, handle, flags):
    return _drv().cuMemMap(devptr(ptr), c_int(size, "size_t"), c_int(offset, "size_t"),
                           _handle(handle), c_int(flags, "unsigned long long"))


@driver_api(0)
def cuMemSetAccess(ptr, size, desc, count):
    descs = list(desc) if desc is not None else []
    if not all(isinstance(x, cu.CUmemAccessDesc) for x in descs):
        raise TypeError("Argument 'desc' is not instance of type (expected "
                        "tuple[cydriver.CUmemAccessDesc,] or list[cydriver.CUmemAccessDesc,]")
    return _drv().cuMemSetAccess(devptr(ptr), c_int(size, "size_t"), descs, c_int(count, "size_t"))


@driver_api(0)
def cuMemUnmap(ptr, size):
    return _drv().cuMemUnmap(devptr(ptr), c_int(size, "size_t"))


@driver_api(0)
def cuMemRelease(handle):
    return _drv().cuMemRelease(_handle(handle))


@driver_api(0)
def cuMemAddressFree(ptr, size):
    return _drv().cuMemAddressFree(devptr(ptr), c_int(size, "size_t"))


# ---- multicast -----------------------------------------------------------------------------------

@driver_api(1)
def cuMulticastGetGranularity(prop, option):
    check_struct(prop, cu.CUmulticastObjectProp, "prop")
    return _drv().cuMulticastGetGranularity(prop, enum_value(option))


@driver_api(1)
def cuMulticastCreate(prop):
    check_struct(prop, cu.CUmulticastObjectProp, "prop")
    return (R.CUDA_SUCCESS, cu.CUmemGenericAllocationHandle(_ok(_drv().cuMulticastCreate(prop))))


@driver_api(0)
def cuMulticastAddDevice(mcHandle, dev):
    return _drv().cuMulticastAddDevice(_handle(mcHandle), handle_value(cu.CUdevice, dev))


@driver_api(0)
def cuMulticastBindMem(mcHandle, mcOffset, memHandle, memOffset, size, flags):
    return _drv().cuMulticastBindMem(_handle(mcHandle), c_int(mcOffset, "size_t"), _handle(memHandle),
                                     c_int(memOffset, "size_t"), c_int(size, "size_t"),
                                     c_int(flags, "unsigned long long"))


@driver_api(0)
def cuMulticastUnbind(mcHandle, dev, mcOffset, size):
    return _drv().cuMulticastUnbind(_handle(mcHandle), handle_value(cu.CUdevice, dev),
                                    c_int(mcOffset, "size_t"), c_int(size, "size_t"))


SIMULATED = tuple(n for n, v in dict(globals()).items()
                  if n.startswith("cu") and not n.startswith("cuda") and callable(v)
                  and not isinstance(v, type))
