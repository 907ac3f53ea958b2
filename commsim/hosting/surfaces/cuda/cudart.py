"""A libcudart that ctypes wrappers find and load, served from the rank's driver.

vLLM's `cuda_wrapper.CudaRTLibrary` and FlashInfer's `comm/cuda_ipc.CudaRTLibrary` find
libcudart by scanning /proc/self/maps for a line containing "libcudart", take the path, open
it with `ctypes.CDLL(path)`, give functions restype/argtypes, and call them with byref()
out-parameters and a 128-byte `cudaIpcMemHandle_t` declared by the wrapper (cuda_runtime_api.h:
the CUDA struct is 64 bytes; the C function reads and writes those 64).

Installing this surface creates a real file named `libcudart.so.13` in a private directory
(0700, unguessable) and maps it read-only into the process, so it appears in
/proc/self/maps; `ctypes.CDLL` of that path (or of the soname) returns the simulated
library (fakelib.py). Its functions are the C ABI over the same per-rank runtime as
`cuda.bindings.runtime` (surfaces/cuda/runtime_api.py): return codes are `cudaError_t` numbers,
`cudaGetErrorString` returns the real runtime's texts (cuda-python's table, which needs no
GPU), so a wrapper's `RuntimeError(f"CUDART error: {text}")` is the real one.
"""

from __future__ import annotations

import atexit
import ctypes
import mmap
import os
import posix
import shutil
import tempfile
from typing import Any, Callable

from cuda.bindings import runtime as _rt

from commsim.driver import IPC_HANDLE_SIZE
from commsim.hosting.surfaces.cuda import runtime_api as api
from commsim.hosting.install import fakelib
from commsim.hosting.install.dispatch import not_simulated
from commsim.hosting.install.patches import Patches
from commsim.hosting.install.registry import register_surface
from commsim.hosting.state.session import hosted

SONAME = "libcudart.so.13"
_EINVAL = int(_rt.cudaError_t.cudaErrorInvalidValue)


def _put(addr: int, ctype: Any, value: int) -> None:
    ctype.from_address(addr).value = value


def _out(addr: int, ctype: Any, call: Callable[[], tuple]) -> int:
    """Run a runtime call returning (err, value) and store the value at addr."""
    if not addr:
        return _EINVAL                       # a NULL out-pointer is an invalid argument
    res = call()
    if int(res[0]) == 0:
        _put(addr, ctype, int(res[1]))
    return int(res[0])


def _handle(blob: Any) -> Any:
    return api.ipc_handle_of(blob if isinstance(blob, bytes) else ctypes.string_at(blob, IPC_HANDLE_SIZE))


def _c_functions() -> dict[str, Callable[..., Any]]:
    """C-level implementations: every argument is a raw int/address or struct bytes."""
    I, P, Z = ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t

    def get_error_string(err: int) -> bytes:
        return _rt.cudaGetErrorString(_err(err))[1]

    def get_error_name(err: int) -> bytes:
        return _rt.cudaGetErrorName(_err(err))[1]

    def ipc_get(handle_addr: int, dev_ptr: int) -> int:
        if not handle_addr:
            return _EINVAL
        err, h = api.cudaIpcGetMemHandle(dev_ptr)
        if int(err) == 0:
            ctypes.memmove(handle_addr, api.ipc_handle_bytes(h), IPC_HANDLE_SIZE)
        return int(err)

    def mem_get_info(free_addr: int, total_addr: int) -> int:
        err, free, total = api.cudaMemGetInfo()
        if int(err) == 0:
            _put(free_addr, Z, free)
            _put(total_addr, Z, total)
        return int(err)

    return {
        "cudaGetErrorString": get_error_string,
        "cudaGetErrorName": get_error_name,
        "cudaGetLastError": lambda: int(api.cudaGetLastError()[0]),
        "cudaPeekAtLastError": lambda: int(api.cudaPeekAtLastError()[0]),
        "cudaSetDevice": lambda dev: int(api.cudaSetDevice(ctypes.c_int(dev).value)[0]),
        "cudaGetDevice": lambda out: _out(out, I, api.cudaGetDevice),
        "cudaGetDeviceCount": lambda out: _out(out, I, api.cudaGetDeviceCount),
        "cudaDeviceSynchronize": lambda: int(api.cudaDeviceSynchronize()[0]),
        "cudaDeviceReset": lambda: int(api.cudaDeviceReset()[0]),
        "cudaDeviceCanAccessPeer": lambda out, d, p: _out(
            out, I, lambda: api.cudaDeviceCanAccessPeer(ctypes.c_int(d).value, ctypes.c_int(p).value)),
        "cudaDeviceEnablePeerAccess": lambda p, f: int(api.cudaDeviceEnablePeerAccess(
            ctypes.c_int(p).value, ctypes.c_uint(f).value)[0]),
        "cudaDeviceGetAttribute": lambda out, attr, dev: _out(
            out, I, lambda: api.cudaDeviceGetAttribute(ctypes.c_int(attr).value, ctypes.c_int(dev).value)),
        "cudaRuntimeGetVersion": lambda out: _out(out, I, api.cudaRuntimeGetVersion),
        "cudaDriverGetVersion": lambda out: _out(out, I, api.cudaDriverGetVersion),
        "cudaMalloc": lambda out, size: _out(out, P, lambda: api.cudaMalloc(size)),
        "cudaFree": lambda ptr: int(api.cudaFree(ptr)[0]),
        "cudaMemset": lambda ptr, value, count: int(api.cudaMemset(ptr, ctypes.c_int(value).value, count)[0]),
        "cudaMemcpy": lambda dst, src, count, kind: int(api.cudaMemcpy(dst, src, count, _kind(kind))[0]),
        "cudaMemcpyAsync": lambda dst, src, count, kind, stream: int(api.cudaMemcpyAsync(
            dst, src, count, _kind(kind), stream or 0)[0]),
        "cudaMemsetAsync": lambda ptr, value, count, stream: int(api.cudaMemsetAsync(
            ptr, ctypes.c_int(value).value, count, stream or 0)[0]),
        "cudaMemGetInfo": mem_get_info,
        "cudaIpcGetMemHandle": ipc_get,
        "cudaIpcOpenMemHandle": lambda out, handle, flags: _out(
            out, P, lambda: api.cudaIpcOpenMemHandle(_handle(handle), ctypes.c_uint(flags).value)),
        "cudaIpcCloseMemHandle": lambda ptr: int(api.cudaIpcCloseMemHandle(ptr)[0]),
    }


def _err(code: int) -> Any:
    try:
        return _rt.cudaError_t(ctypes.c_int(code).value)
    except ValueError:
        return _rt.cudaError_t.cudaErrorUnknown


def _kind(k: int) -> Any:
    try:
        return _rt.cudaMemcpyKind(ctypes.c_int(k).value)
    except ValueError:
        return 99            # not a kind: memcpy answers cudaErrorInvalidMemcpyDirection


_FUNCTIONS = _c_functions()
SIMULATED = tuple(sorted(_FUNCTIONS))
# The symbols the real libcudart exports: every runtime API function cuda-python knows.
_SYMBOLS = frozenset(n for n in dir(_rt) if n.startswith("cuda") and callable(getattr(_rt, n))
                     and not isinstance(getattr(_rt, n), type))


def library(name: str) -> fakelib.FakeLibrary:
    return fakelib.FakeLibrary(name, _FUNCTIONS, lambda s: s in _SYMBOLS or s in _FUNCTIONS,
                               lambda s: not_simulated(f"libcudart.{s}"))


class _Mapped:
    """The real file that makes libcudart visible in /proc/self/maps."""

    def __init__(self) -> None:
        # 0700, unguessable; the real pid (os.getpid may be hosted) in the name lets the
        # launcher's reaper or a later sweep remove it once this process is gone (procs/tree.py)
        self.dir = tempfile.mkdtemp(prefix=f"commsim-rt-{posix.getpid()}-")
        self.path = os.path.join(self.dir, SONAME)
        fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_RDWR | os.O_NOFOLLOW, 0o600)
        try:
            os.write(fd, b"commsim simulated libcudart: served through ctypes.CDLL\n".ljust(
                mmap.PAGESIZE, b"\0"))
            self.map = mmap.mmap(fd, mmap.PAGESIZE, mmap.MAP_PRIVATE, mmap.PROT_READ)
        finally:
            os.close(fd)

    def close(self) -> None:
        self.map.close()
        shutil.rmtree(self.dir, ignore_errors=True)


_mapped: _Mapped | None = None


def mapped_path() -> str | None:
    return _mapped.path if _mapped is not None else None


def _patch(patches: Patches) -> None:
    global _mapped
    _mapped = _Mapped()
    atexit.register(_cleanup)
    patches.on_restore(_cleanup)
    fakelib.serve(patches, "libcudart.so", library, hosted, _mapped.path)


def _cleanup() -> None:
    global _mapped
    if _mapped is not None:
        _mapped.close()
        _mapped = None


SURFACE = register_surface("libcudart", _patch)
install, uninstall = SURFACE.install, SURFACE.uninstall
