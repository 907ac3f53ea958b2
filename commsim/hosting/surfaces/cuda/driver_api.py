"""`cuda.bindings.driver` functions for a hosted rank (cuda-python 13.x signatures).

Same contract as runtime_api.py: the real parameter names, the binding's argument
conversion and return types (`CUdevice`, `CUcontext`, `CUdeviceptr`,
`CUmemGenericAllocationHandle`, `CUmemFabricHandle`, an int fd for POSIX-fd export), and
the driver's rules: nothing but cuInit works before cuInit ("cuInit must be called before
any other function from the driver API", Driver API docs), and calls that act in a context
return CUDA_ERROR_INVALID_CONTEXT when none is current (Driver API docs, cuCtxGetDevice and
the memory calls).
"""

from __future__ import annotations

import ctypes
from typing import Any, Callable

import numpy as np
from cuda.bindings import driver as cu
from cuda.bindings.runtime import cudaMemcpyKind

from commsim.driver import error_string
from commsim.sim.pointers import pointer_info
from commsim.hosting.state import host_layout
from commsim.hosting.surfaces.cuda.device_calls import device_attribute, mem_get_info, memcpy
from commsim.hosting.state.cuda_state import (R, ApiFail, api_call, as_cu, c_int, check_struct, converted, host_buffer,
                         ctx_handle, ctx_ordinal, current, devptr, enum_attr_value, enum_value,
                         handle_value, new_stream, reset_context, state)

A = cu.CUdevice_attribute
P = cu.CUpointer_attribute
HT = cu.CUmemAllocationHandleType
FD = int(HT.CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)
FABRIC = int(HT.CU_MEM_HANDLE_TYPE_FABRIC)


_Err = ApiFail


def driver_api(nvals: int, context: bool = False) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    def before(r: Any, name: str) -> None:
        st = state(r.driver)
        if not st.initialized and name != "cuInit":
            raise ApiFail(R.CUDA_ERROR_NOT_INITIALIZED)
        if context and not st.ctx_bound:
            raise ApiFail(R.CUDA_ERROR_INVALID_CONTEXT)
    return api_call(nvals, False, before)


def _drv() -> Any:
    return current().driver


def _ok(res: tuple) -> Any:
    if int(res[0]) != 0:
        raise _Err(as_cu(res[0]))
    return res[1] if len(res) > 1 else None


def _ordinal(dev: Any) -> int:
    o = handle_value(cu.CUdevice, dev)
    if not 0 <= o < int(_drv().cudaGetDeviceCount()[1]):
        raise _Err(R.CUDA_ERROR_INVALID_DEVICE)
    return o


# ---- initialisation, devices ----------------------------------------------------------------

@driver_api(0)
def cuInit(Flags):
    if c_int(Flags, "unsigned int") != 0:
        raise _Err(R.CUDA_ERROR_INVALID_VALUE)     # "Flags parameter should be 0" (cuInit docs)
    state(_drv()).initialized = True
    return R.CUDA_SUCCESS


@driver_api(1)
def cuDriverGetVersion():
    r = current()
    return (R.CUDA_SUCCESS, host_layout.cuda_driver_version(r.cluster, r.host))


@driver_api(1)
def cuDeviceGetCount():
    return (R.CUDA_SUCCESS, int(_drv().cudaGetDeviceCount()[1]))


@driver_api(1)
def cuDeviceGet(ordinal):
    return (R.CUDA_SUCCESS, cu.CUdevice(_ordinal(c_int(ordinal))))


def _gpu(ordinal: int):
    r = current()
    return r.cluster.gpu(r.driver.proc.gpus[ordinal]), r.driver.proc.gpus[ordinal]


@driver_api(1)
def cuDeviceGetName(length, dev):
    n = c_int(length)
    g, _ = _gpu(_ordinal(dev))
    return (R.CUDA_SUCCESS, g.model.encode()[:max(n - 1, 0)])


@driver_api(1)
def cuDeviceTotalMem(dev):
    g, _ = _gpu(_ordinal(dev))
    return (R.CUDA_SUCCESS, g.memory_bytes)


@driver_api(1)
def cuDeviceGetPCIBusId(length, dev):
    n = c_int(length)
    _, ref = _gpu(_ordinal(dev))
    text = host_layout.pci_address(current().cluster, ref).cuda_bus_id.encode()
    if n <= len(text):
        raise _Err(R.CUDA_ERROR_INVALID_VALUE)
    return (R.CUDA_SUCCESS, text)




@driver_api(1)
def cuDeviceGetAttribute(attrib, dev):
    a = enum_value(attrib)
    o = handle_value(cu.CUdevice, dev)
    code, value = device_attribute(a, o)
    if int(code):
        raise _Err(code)
    return (R.CUDA_SUCCESS, value)


@driver_api(1)
def cuDeviceCanAccessPeer(dev, peerDev):
    return _drv().cuDeviceCanAccessPeer(handle_value(cu.CUdevice, dev),
                                        handle_value(cu.CUdevice, peerDev))


# ---- contexts: one primary context per device, current per process --------------------------

@driver_api(1)
def cuDevicePrimaryCtxRetain(dev):
    d = _drv()
    o = _ordinal(dev)
    st = state(d)
    st.primary_refs[o] = st.primary_refs.get(o, 0) + 1
    return (R.CUDA_SUCCESS, cu.CUcontext(ctx_handle(d, o)))


@driver_api(0)
def cuDevicePrimaryCtxRelease(dev):
    st = state(_drv())
    o = _ordinal(dev)
    if st.primary_refs.get(o, 0) <= 0:
        raise _Err(R.CUDA_ERROR_INVALID_CONTEXT)   # UNCONFIRMED code for an over-release
    st.primary_refs[o] -= 1
    return R.CUDA_SUCCESS


@driver_api(0)
def cuDevicePrimaryCtxReset(dev):
    d = _drv()
    o = _ordinal(dev)
    _ok(d.cuDevicePrimaryCtxReset(o))
    reset_context(d, o)
    return R.CUDA_SUCCESS


@driver_api(1)
def cuCtxGetCurrent():
    d = _drv()
    st = state(d)
    h = ctx_handle(d, int(d.cudaGetDevice()[1])) if st.ctx_bound else 0
    return (R.CUDA_SUCCESS, cu.CUcontext(h))


@driver_api(0)
def cuCtxSetCurrent(ctx):
    d = _drv()
    h = handle_value(cu.CUcontext, ctx)
    st = state(d)
    if h == 0:
        st.ctx_bound = False       # "If ctx is NULL ... unbinds" (cuCtxSetCurrent docs)
        return R.CUDA_SUCCESS
    o = ctx_ordinal(d, h)
    if o is None:
        raise _Err(R.CUDA_ERROR_INVALID_CONTEXT)
    _ok(d.cudaSetDevice(o))
    st.ctx_bound = True
    return R.CUDA_SUCCESS


@driver_api(1, context=True)
def cuCtxGetDevice():
    return (R.CUDA_SUCCESS, cu.CUdevice(int(_drv().cudaGetDevice()[1])))


@driver_api(0, context=True)
def cuCtxSynchronize():
    return _drv().cudaDeviceSynchronize()


# ---- linear memory ---------------------------------------------------------------------------

@driver_api(1, context=True)
def cuMemAlloc(bytesize):
    n = c_int(bytesize, "size_t")
    if n == 0:
        raise _Err(R.CUDA_ERROR_INVALID_VALUE)   # "If bytesize is 0 ... CUDA_ERROR_INVALID_VALUE"
    return (R.CUDA_SUCCESS, cu.CUdeviceptr(_ok(_drv().cudaMalloc(n))))


@driver_api(0, context=True)
def cuMemFree(dptr):
    p = devptr(dptr)
    if p == 0:
        raise _Err(R.CUDA_ERROR_INVALID_VALUE)   # unlike cudaFree(0), UNCONFIRMED code
    return _drv().cudaFree(p)


@driver_api(2, context=True)
def cuMemGetInfo():
    _, free, total = mem_get_info(current())
    return (R.CUDA_SUCCESS, free, total)


def _host_source(src: Any) -> tuple[int, int | None]:
    """(address, size or None for a bare address) of a host buffer, converted as the binding
    converts it (TypeError for what is no buffer) before anything else is checked."""
    return (src, None) if isinstance(src, int) else host_buffer(src)


def _host_read(source: tuple[int, int | None], n: int) -> bytes:
    addr, size = source
    return ctypes.string_at(addr, n if size is None else min(n, size))


def _host_addr(dst: Any) -> int:
    return dst if isinstance(dst, int) else host_buffer(dst)[0]


@driver_api(0, context=True)
def cuMemcpyHtoD(dstDevice, srcHost, ByteCount):
    n = c_int(ByteCount, "size_t")
    source = _host_source(srcHost)
    # The device range before a host byte is read, as DtoH and DtoD check theirs: a count
    # past the allocation is refused alike (unconfirmed.OUT_OF_RANGE_COPY).
    (err,) = _drv().copy_range(devptr(dstDevice), n)
    if int(err) != 0:
        return err
    data = np.frombuffer(_host_read(source, n), dtype=np.uint8)
    return _drv().memcpy_htod(devptr(dstDevice), data)[0]


@driver_api(0, context=True)
def cuMemcpyDtoH(dstHost, srcDevice, ByteCount):
    n = c_int(ByteCount, "size_t")
    dst = _host_addr(dstHost)
    data = _ok(_drv().memcpy_dtoh(devptr(srcDevice), n))
    ctypes.memmove(dst, data.ctypes.data, n)
    return R.CUDA_SUCCESS


@driver_api(0, context=True)
def cuMemcpyDtoD(dstDevice, srcDevice, ByteCount):
    return _drv().cudaMemcpy(devptr(dstDevice), devptr(srcDevice), c_int(ByteCount, "size_t"),
                             cudaMemcpyKind.cudaMemcpyDeviceToDevice)[0]


@driver_api(0, context=True)
def cuMemcpy(dst, src, ByteCount):
    return memcpy(_drv(), devptr(dst), devptr(src), c_int(ByteCount, "size_t"),
                  int(cudaMemcpyKind.cudaMemcpyDefault))


@driver_api(0, context=True)
def cuMemsetD8(dstDevice, uc, N):
    return _drv().memset_d(devptr(dstDevice), c_int(uc, "unsigned char"), c_int(N, "size_t"), 1)[0]


@driver_api(0, context=True)
def cuMemsetD16(dstDevice, us, N):
    return _drv().memset_d(devptr(dstDevice), c_int(us, "unsigned short"), c_int(N, "size_t"), 2)[0]


@driver_api(0, context=True)
def cuMemsetD32(dstDevice, ui, N):
    return _drv().memset_d(devptr(dstDevice), c_int(ui, "unsigned int"), c_int(N, "size_t"), 4)[0]


@driver_api(2)
def cuMemGetAddressRange(dptr):
    info = pointer_info(_drv(), devptr(dptr))
    if info is None:
        raise _Err(R.CUDA_ERROR_NOT_FOUND)       # cuMemGetAddressRange docs
    return (R.CUDA_SUCCESS, cu.CUdeviceptr(info.base), info.size)


def _pointer_attribute(a: int, p: int) -> Any:
    d = _drv()
    info = pointer_info(d, p)
    if info is None:
        # "If ptr was not allocated by ... CUDA ... CUDA_ERROR_INVALID_VALUE" (cuPointerGetAttribute)
        raise _Err(R.CUDA_ERROR_INVALID_VALUE)
    table = {
        int(P.CU_POINTER_ATTRIBUTE_CONTEXT): lambda: cu.CUcontext(ctx_handle(d, info.ordinal)),
        int(P.CU_POINTER_ATTRIBUTE_MEMORY_TYPE): lambda: int(cu.CUmemorytype.CU_MEMORYTYPE_DEVICE),
        int(P.CU_POINTER_ATTRIBUTE_DEVICE_POINTER): lambda: cu.CUdeviceptr(p),
        int(P.CU_POINTER_ATTRIBUTE_IS_MANAGED): lambda: False,
        int(P.CU_POINTER_ATTRIBUTE_BUFFER_ID): lambda: info.buffer_id,
        int(P.CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL): lambda: info.ordinal,
        int(P.CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE): lambda: info.legacy_ipc,
        int(P.CU_POINTER_ATTRIBUTE_RANGE_START_ADDR): lambda: cu.CUdeviceptr(info.base),
        int(P.CU_POINTER_ATTRIBUTE_RANGE_SIZE): lambda: info.size,
        int(P.CU_POINTER_ATTRIBUTE_MAPPED): lambda: info.mapped,
        int(P.CU_POINTER_ATTRIBUTE_ALLOWED_HANDLE_TYPES): lambda: info.handle_types,
    }
    if a not in table:
        raise NotImplementedError(f"commsim hosting: pointer attribute {P(a).name} is not simulated")
    return table[a]()


@driver_api(1, context=True)
def cuPointerGetAttribute(attribute, ptr):
    a = enum_attr_value(attribute)
    return (R.CUDA_SUCCESS, _pointer_attribute(a, devptr(ptr)))


@driver_api(1, context=True)
def cuPointerGetAttributes(numAttributes, attributes, ptr):
    n = c_int(numAttributes, "unsigned int")
    attrs = list(attributes or [])[:n]
    p = devptr(ptr)
    if pointer_info(_drv(), p) is None:
        # cuPointerGetAttributes answers for unknown pointers with per-attribute defaults
        # (docs); commsim does not simulate host pointers: UNCONFIRMED, refuse.
        raise _Err(R.CUDA_ERROR_INVALID_VALUE)
    return (R.CUDA_SUCCESS, [_pointer_attribute(enum_attr_value(a), p) for a in attrs])


# ---- legacy IPC through the driver -------------------------------------------------------------

@driver_api(1, context=True)
def cuIpcGetMemHandle(dptr):
    blob = _ok(_drv().cudaIpcGetMemHandle(devptr(dptr)))
    h = cu.CUipcMemHandle()
    ctypes.memmove(h.getPtr(), blob, len(blob))
    return (R.CUDA_SUCCESS, h)


@driver_api(1, context=True)
def cuIpcOpenMemHandle(handle, Flags):
    check_struct(handle, cu.CUipcMemHandle, "handle", allow_none=False)
    blob = ctypes.string_at(handle.getPtr(), 64)
    return (R.CUDA_SUCCESS, cu.CUdeviceptr(_ok(_drv().cudaIpcOpenMemHandle(blob, c_int(Flags, "unsigned int")))))


@driver_api(0, context=True)
def cuIpcCloseMemHandle(dptr):
    return _drv().cudaIpcCloseMemHandle(devptr(dptr))


# ---- streams -------------------------------------------------------------------------------------

@driver_api(1, context=True)
def cuStreamCreate(Flags):
    c_int(Flags, "unsigned int")
    d = _drv()
    return (R.CUDA_SUCCESS, cu.CUstream(new_stream(d, state(d), int(d.cudaGetDevice()[1]))))


@driver_api(0, context=True)
def cuStreamDestroy(hStream):
    if state(_drv()).streams.pop(handle_value(cu.CUstream, hStream), None) is None:
        raise _Err(R.CUDA_ERROR_INVALID_HANDLE)      # UNCONFIRMED code for a stale stream
    return R.CUDA_SUCCESS


@driver_api(0, context=True)
def cuStreamSynchronize(hStream):
    h = handle_value(cu.CUstream, hStream)
    if h not in (0, 1, 2) and h not in state(_drv()).streams:
        raise _Err(R.CUDA_ERROR_INVALID_HANDLE)      # UNCONFIRMED code for a stale stream
    return R.CUDA_SUCCESS


# ---- error texts (no GPU needed) -----------------------------------------------------------------

@converted
def cuGetErrorString(error):
    # Driver texts are UNCONFIRMED (no GPU here to read them from): the runtime string of the same number.
    code = enum_value(error)
    try:
        R(code)
    except ValueError:
        return (R.CUDA_ERROR_INVALID_VALUE, None)
    return (R.CUDA_SUCCESS, error_string(code).encode())


@converted
def cuGetErrorName(error):
    try:
        name = R(enum_value(error)).name
    except ValueError:
        return (R.CUDA_ERROR_INVALID_VALUE, None)
    return (R.CUDA_SUCCESS, name.encode())


SIMULATED = tuple(n for n, v in dict(globals()).items()
                  if n.startswith("cu") and not n.startswith("cuda") and callable(v)
                  and not isinstance(v, type))
