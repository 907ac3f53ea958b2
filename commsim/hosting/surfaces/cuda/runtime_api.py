"""`cuda.bindings.runtime` functions for a hosted rank (cuda-python 13.x signatures).

Every function has the real binding's parameter names (positional and keyword calls both
work), converts its arguments as the binding does, answers from the rank's SimDriver, and
returns the binding's types: `(cudaError_t, value...)`, pointers as int, handles as the
binding's classes (`cudaIpcMemHandle_t`, `cudaStream_t`, `cudaDeviceProp`,
`cudaPointerAttributes`). A failing call is reported to the rank's events.
"""

from __future__ import annotations

import ctypes
from typing import Any, Callable

from cuda.bindings import runtime as cudart

from commsim.driver import IPC_HANDLE_SIZE
from commsim.sim.pointers import pointer_info
from commsim.hosting.state import host_layout
from commsim.hosting.state.device_props import device_props
from commsim.hosting.surfaces.cuda.device_calls import device_attribute, mem_get_info, memcpy
from commsim.hosting.state.cuda_state import (E, ApiFail, api_call, as_rt, c_int, check_struct, current,
                                              handle_value, new_stream, reset_context, runtime_entry,
                                              state, void_ptr)

K = cudart.cudaMemcpyKind
_Err = ApiFail


def runtime_api(nvals: int, context: bool = True) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """The runtime initialises itself on first use (cuda_state.runtime_entry); `context`:
    the call needs an active context."""
    return api_call(nvals, True, lambda r, name: runtime_entry(r, context))


def _drv() -> Any:
    return current().driver


def _ok(res: tuple) -> Any:
    """The value of a driver result, or raise _Err with its code."""
    if int(res[0]) != 0:
        raise _Err(res[0])
    return res[1] if len(res) > 1 else None


# ---- devices -------------------------------------------------------------------------------

@runtime_api(1, context=False)
def cudaGetDeviceCount():
    return _drv().cudaGetDeviceCount()


@runtime_api(1, context=False)
def cudaGetDevice():
    return _drv().cudaGetDevice()


@runtime_api(0)
def cudaSetDevice(device):
    return _drv().cudaSetDevice(c_int(device))


@runtime_api(0)
def cudaDeviceSynchronize():
    return _drv().cudaDeviceSynchronize()


@runtime_api(0)
def cudaDeviceReset():
    d = _drv()
    me = _ok(d.cudaGetDevice())
    _ok(d.cudaDeviceReset())
    reset_context(d, me)
    return E.cudaSuccess


@runtime_api(1, context=False)
def cudaDeviceCanAccessPeer(device, peerDevice):
    return _drv().cudaDeviceCanAccessPeer(c_int(device), c_int(peerDevice))


@runtime_api(0)
def cudaDeviceEnablePeerAccess(peerDevice, flags):
    # Runtime API docs: flags must be 0; cudaErrorPeerAccessUnsupported when the devices
    # cannot access each other; cudaErrorPeerAccessAlreadyEnabled (704) on a repeat.
    peer, f = c_int(peerDevice), c_int(flags, "unsigned int")
    d = _drv()
    me = _ok(d.cudaGetDevice())
    can = _ok(d.cudaDeviceCanAccessPeer(me, peer))
    if f != 0:
        raise _Err(E.cudaErrorInvalidValue)
    if peer == me or not can:
        raise _Err(E.cudaErrorInvalidDevice if peer == me else E.cudaErrorPeerAccessUnsupported)
    peers = state(d).__dict__.setdefault("peers", set())
    if (me, peer) in peers:
        raise _Err(E.cudaErrorPeerAccessAlreadyEnabled)
    peers.add((me, peer))
    return E.cudaSuccess


@runtime_api(0)
def cudaDeviceDisablePeerAccess(peerDevice):
    peer = c_int(peerDevice)
    d = _drv()
    me = _ok(d.cudaGetDevice())
    peers = state(d).__dict__.setdefault("peers", set())
    if (me, peer) not in peers:
        raise _Err(E.cudaErrorPeerAccessNotEnabled)      # Runtime API docs (705)
    peers.discard((me, peer))
    return E.cudaSuccess


@runtime_api(1, context=False)
def cudaDeviceGetAttribute(attr, device):
    # cudaDeviceAttr shares its numbering with CUdevice_attribute (driver_types.h / cuda.h).
    code, value = device_attribute(int(attr), c_int(device))
    return (as_rt(code), value)


@runtime_api(1, context=False)
def cudaDeviceGetPCIBusId(length, device):
    d = _drv()
    n = c_int(length)
    ordinal = c_int(device)
    r = current()
    gpus = d.proc.gpus
    if not 0 <= ordinal < len(gpus):
        raise _Err(E.cudaErrorInvalidDevice)
    text = host_layout.pci_address(r.cluster, gpus[ordinal]).cuda_bus_id.encode()
    if n <= len(text):
        raise _Err(E.cudaErrorInvalidValue)      # needs room for the terminator
    return (E.cudaSuccess, text)


@runtime_api(1, context=False)
def cudaGetDeviceProperties(device):
    d = _drv()
    ordinal = c_int(device)
    gpus = d.proc.gpus
    if not 0 <= ordinal < len(gpus):
        raise _Err(E.cudaErrorInvalidDevice)
    r = current()
    g = device_props(r.cluster, gpus[ordinal])
    p = cudart.cudaDeviceProp()
    # Only the fields below are simulated; the rest stay 0 (documented in hosting-surfaces).
    # CUDA 13's cudaDeviceProp has no clock fields: those are device attributes only.
    p.name = g.name.encode().ljust(256, b"\0")        # char name[256]
    p.totalGlobalMem = g.total_memory
    p.major, p.minor = g.major, g.minor
    p.multiProcessorCount = g.multi_processor_count
    p.pciBusID, p.pciDeviceID, p.pciDomainID = g.pci.bus, g.pci.device, g.pci.domain
    # gpuPciDeviceID: the product id in NVML's pciDeviceId layout (UNCONFIRMED layout).
    p.gpuPciDeviceID = (g.pci_device_id << 16) | host_layout.NVIDIA_VENDOR
    p.unifiedAddressing = 1
    p.integrated = g.integrated
    p.warpSize = g.warp_size
    p.maxThreadsPerBlock = g.max_threads_per_block
    p.maxThreadsPerMultiProcessor = g.max_threads_per_multi_processor
    p.sharedMemPerBlock = g.shared_memory_per_block
    p.sharedMemPerBlockOptin = g.shared_memory_per_block_optin
    p.sharedMemPerMultiprocessor = g.shared_memory_per_multiprocessor
    p.regsPerBlock = g.regs_per_block
    p.regsPerMultiprocessor = g.regs_per_multiprocessor
    p.l2CacheSize = g.l2_cache_size
    p.memoryBusWidth = g.memory_bus_width
    ctypes.memmove(p.uuid.getPtr(), host_layout.uuid_bytes(g.uuid), 16)   # cudaUUID_t.bytes is read-only
    return (E.cudaSuccess, p)


@runtime_api(1, context=False)
def cudaRuntimeGetVersion():
    # The run's CUDA runtime (commsim/versions.py; 13.0 by default, what the installed
    # cuda-bindings 13.x pairs with).
    return (E.cudaSuccess, current().cluster.versions.cuda_runtime)


@runtime_api(1, context=False)
def cudaDriverGetVersion():
    r = current()
    return (E.cudaSuccess, host_layout.cuda_driver_version(r.cluster, r.host))


def cudaGetLastError():
    """Returns and clears the sticky last error (Runtime API docs)."""
    r = current()
    st = runtime_entry(r, context=False)
    code, st.last_error = st.last_error, 0
    return (as_rt(code),)


def cudaPeekAtLastError():
    st = runtime_entry(current(), context=False)
    return (as_rt(st.last_error),)


# ---- memory -------------------------------------------------------------------------------

@runtime_api(1)
def cudaMalloc(size):
    return _drv().cudaMalloc(c_int(size, "size_t"))


@runtime_api(0)
def cudaFree(devPtr):
    return _drv().cudaFree(void_ptr(devPtr))


@runtime_api(0)
def cudaMemset(devPtr, value, count):
    return _drv().cudaMemset(void_ptr(devPtr), c_int(value), c_int(count, "size_t"))


@runtime_api(2)
def cudaMemGetInfo():
    return mem_get_info(current())




@runtime_api(0)
def cudaMemcpy(dst, src, count, kind):
    k = int(kind)
    return (memcpy(_drv(), void_ptr(dst), void_ptr(src), c_int(count, "size_t"), k),)


# ---- asynchronous copies and sets: work completes at launch in the simulator, so each is its
# synchronous twin on a known stream. Inside a stream capture the GPU records them into the
# graph and re-runs them at every launch, which this model cannot do: refused loudly.

def _async_on(d: Any, stream: Any, what: str) -> None:
    _known_stream(d, _stream(stream))
    cap = getattr(d, "capture", None)
    if cap is not None and cap.mode is not None:
        raise NotImplementedError(f"commsim hosting: {what} inside a stream capture is not "
                                  f"simulated (a graph launch would re-run it)")


@runtime_api(0)
def cudaMemcpyAsync(dst, src, count, kind, stream):
    d = _drv()
    _async_on(d, stream, "cudaMemcpyAsync")
    return (memcpy(d, void_ptr(dst), void_ptr(src), c_int(count, "size_t"), int(kind)),)


@runtime_api(0)
def cudaMemsetAsync(devPtr, value, count, stream):
    d = _drv()
    _async_on(d, stream, "cudaMemsetAsync")
    return d.cudaMemset(void_ptr(devPtr), c_int(value), c_int(count, "size_t"))


@runtime_api(1)
def cudaPointerGetAttributes(ptr):
    d = _drv()
    p = void_ptr(ptr)
    a = cudart.cudaPointerAttributes()
    info = pointer_info(d, p)
    if info is None:
        # Since CUDA 11 an unregistered host pointer is cudaSuccess with type
        # cudaMemoryTypeUnregistered (Runtime API docs, cudaPointerGetAttributes).
        a.type = cudart.cudaMemoryType.cudaMemoryTypeUnregistered
        a.device = -2
        a.hostPointer = p
        return (E.cudaSuccess, a)
    a.type = cudart.cudaMemoryType.cudaMemoryTypeDevice
    a.device = info.ordinal
    a.devicePointer = p
    a.hostPointer = 0
    return (E.cudaSuccess, a)


# ---- legacy IPC ---------------------------------------------------------------------------

def ipc_handle_bytes(handle: Any) -> bytes:
    """The 64 bytes of a cudaIpcMemHandle_t (cuda-python 13 exposes them only through
    getPtr(): CUDA_IPC_HANDLE_SIZE bytes at that address; cuda_runtime_api.h)."""
    return ctypes.string_at(handle.getPtr(), IPC_HANDLE_SIZE)


def ipc_handle_of(blob: bytes) -> Any:
    h = cudart.cudaIpcMemHandle_t()
    ctypes.memmove(h.getPtr(), bytes(blob)[:IPC_HANDLE_SIZE], min(len(blob), IPC_HANDLE_SIZE))
    return h


@runtime_api(1)
def cudaIpcGetMemHandle(devPtr):
    blob = _ok(_drv().cudaIpcGetMemHandle(void_ptr(devPtr)))
    return (E.cudaSuccess, ipc_handle_of(blob))


@runtime_api(1)
def cudaIpcOpenMemHandle(handle, flags):
    check_struct(handle, cudart.cudaIpcMemHandle_t, "handle", allow_none=False)
    f = c_int(flags, "unsigned int")
    return _drv().cudaIpcOpenMemHandle(ipc_handle_bytes(handle), f)


@runtime_api(0)
def cudaIpcCloseMemHandle(devPtr):
    return _drv().cudaIpcCloseMemHandle(void_ptr(devPtr))


# ---- streams (work completes at launch in the simulator, so a stream is a name) -----------

def _stream(x: Any) -> int:
    return handle_value(cudart.cudaStream_t, x)


@runtime_api(1)
def cudaStreamCreate():
    d = _drv()
    h = new_stream(d, state(d), _ok(d.cudaGetDevice()))
    return (E.cudaSuccess, cudart.cudaStream_t(h))


@runtime_api(1)
def cudaStreamCreateWithFlags(flags):
    c_int(flags, "unsigned int")
    return cudaStreamCreate.__wrapped__()


@runtime_api(0)
def cudaStreamDestroy(stream):
    h = _stream(stream)
    if state(_drv()).streams.pop(h, None) is None:
        raise _Err(E.cudaErrorInvalidResourceHandle)   # UNCONFIRMED code for a stale stream
    return E.cudaSuccess


def _known_stream(d: Any, h: int) -> None:
    # 0 is the legacy default stream, 1 / 2 the per-thread and legacy handles (cuda.h).
    if h not in (0, 1, 2) and h not in state(d).streams:
        raise _Err(E.cudaErrorInvalidResourceHandle)   # UNCONFIRMED code for a stale stream


@runtime_api(0)
def cudaStreamSynchronize(stream):
    _known_stream(_drv(), _stream(stream))
    return E.cudaSuccess


SIMULATED = tuple(n for n, v in dict(globals()).items()
                  if n.startswith("cuda") and callable(v) and not isinstance(v, type))
