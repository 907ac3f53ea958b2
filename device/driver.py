"""CudaDriver: the Driver protocol (commsim/driver.py) over a real GPU.

cuda-python's `cuda.bindings.runtime` / `driver` for CUDA, nvidia-ml-py for NVML, the OS for
host identity. Names, argument order and the `(err, value...)` convention are SimDriver's,
and so are the value conventions: IPC and fabric handles as 64-byte `bytes`, VMM and
multicast handles as `int`, POSIX fds as `int` (device/handles.py converts). Arguments are
converted as SimDriver converts them (commsim.sim.binding_args, the binding's own rules): what
cuda-python cannot convert (a negative size, a 65-bit pointer, a str) raises the binding's
TypeError / ValueError / OverflowError, and 4096.7 is 4096; what converts but CUDA would not
take (an unknown enum value) answers `*_INVALID_VALUE`.

Importing this module needs no GPU; `CudaDriver.create(device)` raises NoGpuError with what is
missing (`unavailable_reason()` says it without raising).

Deliberate limits, all matching the simulator: `cudaMemcpy` / `cudaMemset` accept only
device ranges (checked with cuPointerGetAttribute first, so a garbage "host" pointer gets
cudaErrorInvalidValue instead of a segfault in the runtime); copies, memsets and
`launch_kernel` return when the device work is done (SimDriver's complete at the call), so
`launch_kernel` returns the kernel's own error.
"""

from __future__ import annotations

import ctypes
import functools
import os
from typing import Any, Callable, Sequence

import numpy as np
from cuda.bindings import driver as cu
from cuda.bindings import runtime as cudart

from commsim.driver import FABRIC, FD
from commsim.sim import binding_args

from . import handles, launch
from . import host as hostinfo
from .errors import NoGpuError
from .fd_channel import UnixFdChannel
from .nvml import NVML_ERROR_INVALID_ARGUMENT, Nvml

E = cudart.cudaError_t
R = cu.CUresult
A = cu.CUdevice_attribute
_H2D = cudart.cudaMemcpyKind.cudaMemcpyHostToDevice
_D2H = cudart.cudaMemcpyKind.cudaMemcpyDeviceToHost
_D2D = cudart.cudaMemcpyKind.cudaMemcpyDeviceToDevice


def _driver_library_problem() -> str:
    try:
        ctypes.CDLL("libcuda.so.1")
    except OSError as e:
        return str(e).removeprefix("libcuda.so.1: ") or "dlopen failed"
    return ""


def unavailable_reason(device: int | None = None) -> str:
    """Why no CUDA device (or not `device`) can be used here; "" when it can."""
    lib = _driver_library_problem()
    try:
        err, n = cudart.cudaGetDeviceCount()
    except Exception as e:  # the bindings could not even load their runtime
        return f"CUDA cannot start: cudaGetDeviceCount raised {type(e).__name__}: {e}"
    if lib:
        return (f"no NVIDIA driver: libcuda.so.1 not found (cudaGetDeviceCount: {err.name}; "
                f"dlopen: {lib})")
    if int(err) != 0:
        return f"CUDA cannot start: cudaGetDeviceCount: {err.name}"
    if not n:
        vis = os.environ.get("CUDA_VISIBLE_DEVICES")
        return ("no CUDA device visible (cudaGetDeviceCount: 0 devices"
                + (f"; CUDA_VISIBLE_DEVICES={vis!r}" if vis is not None else "") + ")")
    if device is not None and not 0 <= device < n:
        return f"no CUDA device {device}: {n} device(s) visible (ordinals 0..{n - 1})"
    return ""


def _rt(code: Any) -> Any:
    """A CUresult as the cudaError_t of the same number (the runtime-style calls answer
    runtime codes, as SimDriver's do); numbers the runtime lacks become cudaErrorUnknown."""
    try:
        return E(int(code))
    except ValueError:
        return E.cudaErrorUnknown


def _guard(nvals: int, runtime: bool) -> Callable:
    """The arguments converted as SimDriver converts them (binding_args: what the binding
    cannot convert raises here, as there); a converted value that this module's own enum
    lookups refuse answers the invalid-value code of its API family."""
    bad = E.cudaErrorInvalidValue if runtime else R.CUDA_ERROR_INVALID_VALUE

    def deco(fn: Callable) -> Callable:
        name = fn.__name__

        @functools.wraps(fn)
        def wrapper(self: "CudaDriver", *args: Any) -> tuple:
            args = binding_args.convert(name, args)
            try:
                return fn(self, *args)
            except (TypeError, ValueError, OverflowError):
                return (bad,) + (None,) * nvals
        return wrapper
    return deco


def _out(res: tuple, conv: Callable[[Any], Any] = lambda v: v) -> tuple:
    """(err, value) with the value converted on success and None on failure."""
    err, value = res[0], res[1]
    return (err, conv(value)) if int(err) == 0 else (err, None)


def _enum(kind: Any, v: Any) -> Any:
    return v if isinstance(v, kind) else kind(int(v))


class CudaDriver:
    """The Driver protocol for this process on a real GPU."""

    def __init__(self, device: int = 0):
        why = unavailable_reason(device)
        if why:
            raise NoGpuError(why)
        (err,) = cu.cuInit(0)
        if int(err) != 0:
            raise NoGpuError(f"cuInit: {err.name}")
        err, = cudart.cudaSetDevice(device)
        if int(err) == 0:
            (err,) = cudart.cudaFree(0)   # create the primary context now, not mid-collective
        if int(err) != 0:
            raise NoGpuError(f"CUDA device {device} cannot be used: {err.name}")
        self.device = device
        self.nvml = Nvml()
        self._modules: dict[tuple[int, str], Any] = {}
        self._functions: dict[tuple[int, str], Any] = {}
        self._sm_counts: dict[int, int] = {}
        self._fd_channel: UnixFdChannel | None = None

    @classmethod
    def create(cls, device: int = 0) -> "CudaDriver":
        """A driver bound to CUDA device `device`; NoGpuError when there is none."""
        return cls(device)

    # ---- identity -------------------------------------------------------------------------
    def gethostname(self) -> str:
        return hostinfo.gethostname()

    def getpid(self) -> int:
        return os.getpid()

    def shm_namespace(self) -> str:
        return hostinfo.shm_namespace()

    def shm_dir(self) -> str | None:
        """None: the ranks that share an in-memory /dev/shm store are threads of this process;
        ranks in processes of their own take no NCCL segments (backends/nccl.py decides by
        the rules there), so nothing is written to the real /dev/shm."""
        return None

    def imex_channels(self) -> tuple[int, ...]:
        return hostinfo.imex_channels()

    def cudaGetDeviceCount(self) -> tuple:
        return _out(cudart.cudaGetDeviceCount())

    def cudaGetDevice(self) -> tuple:
        return _out(cudart.cudaGetDevice())

    @_guard(0, True)
    def cudaSetDevice(self, device: int) -> tuple:
        res = cudart.cudaSetDevice(int(device))
        if int(res[0]) == 0:
            self.device = int(device)
        return res

    def cudaDeviceSynchronize(self) -> tuple:
        return cudart.cudaDeviceSynchronize()

    @_guard(0, True)
    def cudaDeviceReset(self) -> tuple:
        return cudart.cudaDeviceReset()

    @_guard(0, False)
    def cuDevicePrimaryCtxReset(self, dev: int) -> tuple:
        return cu.cuDevicePrimaryCtxReset(int(dev))

    @_guard(1, False)
    def cuDeviceGetAttribute(self, attrib: Any, dev: int) -> tuple:
        return _out(cu.cuDeviceGetAttribute(_enum(A, attrib), int(dev)), int)

    @_guard(1, False)
    def cuDeviceCanAccessPeer(self, dev: int, peer_dev: int) -> tuple:
        return _out(cu.cuDeviceCanAccessPeer(int(dev), int(peer_dev)), int)

    @_guard(1, True)
    def cudaDeviceCanAccessPeer(self, device: int, peer_device: int) -> tuple:
        return _out(cudart.cudaDeviceCanAccessPeer(int(device), int(peer_device)), int)

    @_guard(1, True)
    def cudaThreadExchangeStreamCaptureMode(self, mode: Any) -> tuple:
        return _out(cudart.cudaThreadExchangeStreamCaptureMode(_enum(cudart.cudaStreamCaptureMode, mode)))

    # ---- legacy memory ----------------------------------------------------------------------
    @_guard(1, True)
    def cudaMalloc(self, size: int) -> tuple:
        return _out(cudart.cudaMalloc(int(size)), int)

    @_guard(0, True)
    def cudaFree(self, dev_ptr: int) -> tuple:
        return cudart.cudaFree(int(dev_ptr))

    def _device_range(self, ptr: int, nbytes: int) -> bool:
        """[ptr, ptr + nbytes) lies inside one device allocation or mapping of this process."""
        if ptr <= 0 or nbytes < 0 or ptr + nbytes > 1 << 64:
            return False
        attrs = cu.CUpointer_attribute
        # cudaMalloc / IPC ranges answer RANGE_*; cuMemMap'ed ranges also MAPPING_*.
        for base_attr, size_attr in ((attrs.CU_POINTER_ATTRIBUTE_RANGE_START_ADDR,
                                      attrs.CU_POINTER_ATTRIBUTE_RANGE_SIZE),
                                     (attrs.CU_POINTER_ATTRIBUTE_MAPPING_BASE_ADDR,
                                      attrs.CU_POINTER_ATTRIBUTE_MAPPING_SIZE)):
            err, start = cu.cuPointerGetAttribute(base_attr, ptr)
            if int(err) != 0:
                continue
            err, size = cu.cuPointerGetAttribute(size_attr, ptr)
            if int(err) == 0 and int(start) <= ptr and ptr + nbytes <= int(start) + int(size):
                return True
        return False

    def _done(self, res: tuple) -> tuple:
        """Wait for the copy or memset just issued: SimDriver's complete when they return,
        and code written against it (zero the flags, then exchange handles) must not race a
        memset still queued on the stream. D2D cudaMemcpy, cudaMemset and pageable H2D copies
        may all return before the device is done."""
        if int(res[0]) != 0:
            return res
        return cudart.cudaStreamSynchronize(0)

    @_guard(0, True)
    def cudaMemcpy(self, dst: int, src: int, count: int, kind: Any) -> tuple:
        dst, src, count = int(dst), int(src), int(count)
        _enum(cudart.cudaMemcpyKind, kind)          # an unknown kind is an invalid value
        if count < 0:
            return (E.cudaErrorInvalidValue,)
        if count == 0:
            return (E.cudaSuccess,)
        if not (self._device_range(dst, count) and self._device_range(src, count)):
            return (E.cudaErrorInvalidValue,)
        return self._done(cudart.cudaMemcpy(dst, src, count, _D2D))

    @_guard(0, True)
    def cudaMemset(self, dev_ptr: int, value: int, count: int) -> tuple:
        ptr, count = int(dev_ptr), int(count)
        if count < 0 or (count and not self._device_range(ptr, count)):
            return (E.cudaErrorInvalidValue,)
        return self._done(cudart.cudaMemset(ptr, int(value) & 0xFF, count))

    @_guard(0, True)
    def memcpy_htod(self, dst: int, host: np.ndarray) -> tuple:
        """cudaMemcpy(dst, host, nbytes, HostToDevice) with the host side as an array."""
        b = np.ascontiguousarray(host).view(np.uint8).reshape(-1)
        if b.size and not self._device_range(int(dst), b.size):
            return (E.cudaErrorInvalidValue,)
        if not b.size:
            return (E.cudaSuccess,)
        return self._done(cudart.cudaMemcpy(int(dst), b.ctypes.data, b.size, _H2D))

    @_guard(1, True)
    def memcpy_dtoh(self, src: int, nbytes: int) -> tuple:
        n = int(nbytes)
        if n < 0 or (n and not self._device_range(int(src), n)):
            return (E.cudaErrorInvalidValue, None)
        out = np.empty(n, dtype=np.uint8)
        if n:
            (err,) = cudart.cudaMemcpy(out.ctypes.data, int(src), n, _D2H)
            if int(err) != 0:
                return (err, None)
        return (E.cudaSuccess, out)

    # ---- legacy IPC ---------------------------------------------------------------------------
    @_guard(1, True)
    def cudaIpcGetMemHandle(self, dev_ptr: int) -> tuple:
        return _out(cudart.cudaIpcGetMemHandle(int(dev_ptr)), handles.ipc_bytes)

    @_guard(1, True)
    def cudaIpcOpenMemHandle(self, handle: Any, flags: int) -> tuple:
        data = handles.blob(handle)
        if data is None:
            return (E.cudaErrorInvalidResourceHandle, None)   # as SimDriver: no such handle
        return _out(cudart.cudaIpcOpenMemHandle(handles.ipc_handle(data), int(flags)), int)

    @_guard(0, True)
    def cudaIpcCloseMemHandle(self, dev_ptr: int) -> tuple:
        return cudart.cudaIpcCloseMemHandle(int(dev_ptr))

    @_guard(1, False)
    def cuPointerGetAttribute(self, attribute: Any, ptr: int) -> tuple:
        return _out(cu.cuPointerGetAttribute(_enum(cu.CUpointer_attribute, attribute), int(ptr)), int)

    # ---- VMM ------------------------------------------------------------------------------------
    @_guard(1, False)
    def cuMemGetAllocationGranularity(self, prop: Any, option: Any) -> tuple:
        return _out(cu.cuMemGetAllocationGranularity(
            prop, _enum(cu.CUmemAllocationGranularity_flags, option)), int)

    @_guard(1, False)
    def cuMemCreate(self, size: int, prop: Any, flags: int) -> tuple:
        return _out(cu.cuMemCreate(int(size), prop, int(flags)), handles.as_int)

    @_guard(1, False)
    def cuMemExportToShareableHandle(self, handle: int, handle_type: Any, flags: int) -> tuple:
        t = _enum(cu.CUmemAllocationHandleType, handle_type)
        err, shared = cu.cuMemExportToShareableHandle(int(handle), t, int(flags))
        if int(err) != 0:
            return (err, None)
        if int(t) == FABRIC:
            return (err, handles.fabric_bytes(shared))   # 64 bytes, any transport
        return (err, int(shared))                         # the fd

    @_guard(1, False)
    def cuMemImportFromShareableHandle(self, os_handle: Any, handle_type: Any) -> tuple:
        t = _enum(cu.CUmemAllocationHandleType, handle_type)
        if int(t) == FABRIC:
            data = handles.blob(os_handle)
            if data is None:
                return (R.CUDA_ERROR_INVALID_VALUE, None)
            fh = handles.fabric_handle(data)
            return _out(cu.cuMemImportFromShareableHandle(int(fh.getPtr()), t), handles.as_int)
        if int(t) != FD or isinstance(os_handle, (bytes, bytearray)):
            return (R.CUDA_ERROR_INVALID_VALUE, None)
        # The C API takes the fd cast to void*: an int passes as exactly that pointer value.
        return _out(cu.cuMemImportFromShareableHandle(int(os_handle), t), handles.as_int)

    @_guard(1, False)
    def cuMemAddressReserve(self, size: int, alignment: int, addr: int, flags: int) -> tuple:
        return _out(cu.cuMemAddressReserve(int(size), int(alignment), int(addr), int(flags)), int)

    @_guard(0, False)
    def cuMemMap(self, ptr: int, size: int, offset: int, handle: int, flags: int) -> tuple:
        return cu.cuMemMap(int(ptr), int(size), int(offset), int(handle), int(flags))

    @_guard(0, False)
    def cuMemSetAccess(self, ptr: int, size: int, desc: Sequence[Any], count: int) -> tuple:
        return cu.cuMemSetAccess(int(ptr), int(size), list(desc), int(count))

    @_guard(0, False)
    def cuMemUnmap(self, ptr: int, size: int) -> tuple:
        return cu.cuMemUnmap(int(ptr), int(size))

    @_guard(0, False)
    def cuMemRelease(self, handle: int) -> tuple:
        return cu.cuMemRelease(int(handle))

    @_guard(0, False)
    def cuMemAddressFree(self, ptr: int, size: int) -> tuple:
        return cu.cuMemAddressFree(int(ptr), int(size))

    # ---- multicast --------------------------------------------------------------------------------
    @_guard(1, False)
    def cuMulticastGetGranularity(self, prop: Any, option: Any) -> tuple:
        return _out(cu.cuMulticastGetGranularity(
            prop, _enum(cu.CUmulticastGranularity_flags, option)), int)

    @_guard(1, False)
    def cuMulticastCreate(self, prop: Any) -> tuple:
        return _out(cu.cuMulticastCreate(prop), handles.as_int)

    @_guard(0, False)
    def cuMulticastAddDevice(self, mc_handle: int, dev: int) -> tuple:
        return cu.cuMulticastAddDevice(int(mc_handle), int(dev))

    @_guard(0, False)
    def cuMulticastBindMem(self, mc_handle: int, mc_offset: int, mem_handle: int,
                           mem_offset: int, size: int, flags: int) -> tuple:
        return cu.cuMulticastBindMem(int(mc_handle), int(mc_offset), int(mem_handle),
                                     int(mem_offset), int(size), int(flags))

    @_guard(0, False)
    def cuMulticastUnbind(self, mc_handle: int, dev: int, mc_offset: int, size: int) -> tuple:
        return cu.cuMulticastUnbind(int(mc_handle), int(dev), int(mc_offset), int(size))

    # ---- NVML ----------------------------------------------------------------------------------
    def nvml_device(self, index: Any) -> tuple[int, Any]:
        """The NVML device behind CUDA ordinal `index`, matched by UUID: NVML numbers every GPU
        of the host, CUDA only the visible ones (CUDA_VISIBLE_DEVICES), in its own order.
        Discovery passes CUDA ordinals; on the simulator the two numberings agree."""
        try:
            i = int(index)
        except (TypeError, ValueError):
            return NVML_ERROR_INVALID_ARGUMENT, None
        err, uuid = cu.cuDeviceGetUuid(i) if i >= 0 else (R.CUDA_ERROR_INVALID_DEVICE, None)
        if int(err) != 0:
            return NVML_ERROR_INVALID_ARGUMENT, None
        h = bytes(uuid.bytes).hex()
        rc, dev = self.nvml.by_uuid(f"GPU-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}")
        if rc != 0:   # a MIG instance, or an NVML that spells UUIDs otherwise
            rc, dev = self.nvml.by_index(i)
        return rc, dev

    def nvmlDeviceGetGpuFabricInfo(self, index: int) -> tuple:
        rc, dev = self.nvml_device(index)
        return (rc, None) if rc else self.nvml.fabric_info(dev)

    def nvmlDeviceGetP2PStatus(self, index1: int, index2: int) -> tuple:
        rc, a = self.nvml_device(index1)
        if rc == 0:
            rc, b = self.nvml_device(index2)
        if rc:
            return (rc, None)
        if index1 == index2:
            return (0, 0)   # NVML_P2P_STATUS_OK with itself, as the simulator answers
        return self.nvml.p2p_status(a, b)

    def nvmlDeviceGetNvLinkState(self, index: int) -> tuple:
        rc, dev = self.nvml_device(index)
        return (rc, None) if rc else self.nvml.nvlinks_up(dev)

    def nvmlDeviceGetCount(self) -> tuple:
        return self.nvml.count()

    def pci_path(self, index1: int, index2: int) -> str:
        """The PCIe path between two GPUs by NVML index (PIX, PXB, PHB, NODE, SYS; "" for one
        GPU or an index NVML does not know), as the simulated driver answers it."""
        if index1 == index2:
            return ""
        rc, a = self.nvml_device(index1)
        rc2, b = self.nvml_device(index2) if rc == 0 else (rc, None)
        if rc or rc2:
            return ""
        rc, level = self.nvml.pci_level(a, b)
        return level if rc == 0 and level else ""

    # ---- kernels ---------------------------------------------------------------------------------
    def sm_count(self) -> int:
        dev = self.device
        if dev not in self._sm_counts:
            err, n = cu.cuDeviceGetAttribute(A.CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, dev)
            self._sm_counts[dev] = int(n) if int(err) == 0 else 1
        return self._sm_counts[dev]

    def compute_capability(self) -> int:
        dev = self.device
        _, major = cu.cuDeviceGetAttribute(A.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev)
        _, minor = cu.cuDeviceGetAttribute(A.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev)
        return int(major) * 10 + int(minor)

    def _function(self, unit: str, entry: str) -> tuple[Any, Any]:
        """(cudaError_t, CUfunction) of an entry point, compiling and loading on first use."""
        key = (self.device, entry)
        if key in self._functions:
            return E.cudaSuccess, self._functions[key]
        from . import build
        mkey = (self.device, unit)
        if mkey not in self._modules:
            try:
                image = build.image_for_device(unit, self.compute_capability()).image
            except (build.CompileError, build.NvrtcUnavailable):
                return E.cudaErrorNoKernelImageForDevice, None
            err, mod = cu.cuModuleLoadData(image)
            if int(err) != 0:
                return _rt(err), None
            self._modules[mkey] = mod
        err, fn = cu.cuModuleGetFunction(self._modules[mkey], entry.encode())
        if int(err) != 0:
            return E.cudaErrorInvalidDeviceFunction, None
        self._functions[key] = fn
        return E.cudaSuccess, fn

    def launch_async(self, kernel: Any, *args: Any, stream: Any = 0) -> tuple:
        """Launch without waiting (benchmarks); errors of the kernel itself come later."""
        if launch.kernel_name(kernel) not in launch.PLANNERS:
            return (E.cudaErrorInvalidDeviceFunction,)   # e.g. a simulator-only test kernel
        try:
            lp = launch.plan(kernel, args, self.sm_count())
        except launch.LaunchError:
            return (E.cudaErrorInvalidValue,)
        err, fn = self._function(lp.unit, lp.entry)
        if int(err) != 0:
            return (err,)
        params = lp.param_array()
        (res,) = cu.cuLaunchKernel(fn, lp.grid, 1, 1, lp.block, 1, 1, 0, stream,
                                   ctypes.addressof(params), 0)
        return (_rt(res),)

    def launch_kernel(self, kernel: Any, *args: Any) -> tuple:
        """Run the device twin of a simulator kernel (device/launch.py) and wait for it: a
        fault inside it (unmapped, no access, freed memory) is cudaErrorIllegalAddress (700),
        as SimDriver reports it. On hardware that error is sticky: the context is lost."""
        res = self.launch_async(kernel, *args)
        if int(res[0]) != 0:
            return res
        return cudart.cudaDeviceSynchronize()

    # ---- fds ------------------------------------------------------------------------------------
    def close_fd(self, fd: int) -> int:
        """os.close of an exported or received fd: 0, or -1 (EBADF) like the syscall."""
        try:
            os.close(int(fd))
        except (OSError, TypeError, ValueError, OverflowError):
            return -1
        return 0

    def fd_channel(self) -> UnixFdChannel:
        """This process's FdChannel (SCM_RIGHTS over a Unix socket), listening from first use."""
        if self._fd_channel is None:
            self._fd_channel = UnixFdChannel()
        return self._fd_channel
