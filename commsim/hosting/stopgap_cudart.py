"""STOP-GAP until issue 16b's `commsim.hosting.cudart` lands: a ctypes-loadable libcudart.

Serving stacks wrap libcudart themselves: they find the loaded `libcudart.so*` by name in
/proc/self/maps, open it with `ctypes.CDLL`, give each function `restype` / `argtypes`, and
call it with `byref` out-parameters and 128-byte IPC handle structs. This module gives a
hosted process that much over the rank's driver (the same calls commsim.facade.CudaRTLibrary
serves): a real file named `libcudart.so.12` is mapped into the process so /proc/self/maps
lists it, and `ctypes.CDLL` of any `libcudart*` path in a hosted rank returns a library whose
functions dispatch, at call time, to the running rank's driver. A function it does not serve
raises NotImplementedError naming itself.

It registers only while `commsim/hosting/cudart.py` (16b's full surface) does not exist.
"""

from __future__ import annotations

import atexit
import ctypes
import importlib.util
import mmap
import os
import shutil
import tempfile
from typing import Any

from ..driver import error_name, error_string
from .session import current, hosted
from .surfaces import register_surface

LIBNAME = "libcudart.so.12"
MEMCPY_DEFAULT = 4     # cudaMemcpyDefault
_state: dict[str, Any] = {}


def _value(x: Any) -> int:
    if isinstance(x, ctypes.c_void_p):
        return x.value or 0
    if isinstance(x, ctypes._SimpleCData):
        return int(x.value or 0)
    return int(x or 0)


def _target(p: Any) -> Any:
    """The object an out-parameter points at: byref(x) -> x, pointer(x) -> x."""
    obj = getattr(p, "_obj", None)
    if obj is not None:
        return obj
    if isinstance(p, ctypes._Pointer):
        return p.contents
    return p


def _store(p: Any, v: int) -> None:
    _target(p).value = v


def _blob(h: Any) -> bytes:
    return bytes(memoryview(_target(h)).cast("B"))[:64]


def _put_blob(p: Any, data: bytes) -> None:
    t = _target(p)
    ctypes.memmove(ctypes.addressof(t), data, min(len(data), ctypes.sizeof(t)))


def _drv() -> Any:
    return current().driver


def _err(res: Any) -> int:
    return int(res[0])


def cudaGetErrorString(err: Any) -> bytes:
    return error_string(_value(err)).encode()


def cudaGetErrorName(err: Any) -> bytes:
    from cuda.bindings import runtime as rt
    try:
        return error_name(rt.cudaError_t(_value(err))).encode()
    except ValueError:
        return b"cudaErrorUnknown"


def cudaGetDeviceCount(pcount: Any) -> int:
    res = _drv().cudaGetDeviceCount()
    if _err(res) == 0:
        _store(pcount, res[1])
    return _err(res)


def cudaSetDevice(dev: Any) -> int:
    return _err(_drv().cudaSetDevice(_value(dev)))


def cudaGetDevice(pdev: Any) -> int:
    res = _drv().cudaGetDevice()
    if _err(res) == 0:
        _store(pdev, res[1])
    return _err(res)


def cudaDeviceCanAccessPeer(pcan: Any, device: Any, peer: Any) -> int:
    res = _drv().cudaDeviceCanAccessPeer(_value(device), _value(peer))
    if _err(res) == 0:
        _store(pcan, int(res[1]))
    return _err(res)


def cudaDeviceSynchronize() -> int:
    return _err(_drv().cudaDeviceSynchronize())


def cudaMalloc(pptr: Any, size: Any) -> int:
    res = _drv().cudaMalloc(_value(size))
    if _err(res) == 0:
        _store(pptr, res[1])
    return _err(res)


def cudaFree(ptr: Any) -> int:
    return _err(_drv().cudaFree(_value(ptr)))


def cudaMemset(ptr: Any, value: Any, count: Any) -> int:
    return _err(_drv().cudaMemset(_value(ptr), _value(value), _value(count)))


def cudaMemcpy(dst: Any, src: Any, count: Any, kind: Any = MEMCPY_DEFAULT) -> int:
    from cuda.bindings import runtime as rt
    return _err(_drv().cudaMemcpy(_value(dst), _value(src), _value(count),
                                  rt.cudaMemcpyKind(_value(kind))))


def cudaIpcGetMemHandle(phandle: Any, ptr: Any) -> int:
    res = _drv().cudaIpcGetMemHandle(_value(ptr))
    if _err(res) == 0:
        _put_blob(phandle, bytes(res[1]))
    return _err(res)


def cudaIpcOpenMemHandle(pptr: Any, handle: Any, flags: Any) -> int:
    res = _drv().cudaIpcOpenMemHandle(_blob(handle), _value(flags))
    if _err(res) == 0:
        _store(pptr, res[1])
    return _err(res)


def cudaIpcCloseMemHandle(ptr: Any) -> int:
    return _err(_drv().cudaIpcCloseMemHandle(_value(ptr)))


SERVED = {f.__name__: f for f in (
    cudaGetErrorString, cudaGetErrorName, cudaGetDeviceCount, cudaSetDevice, cudaGetDevice,
    cudaDeviceCanAccessPeer, cudaDeviceSynchronize, cudaMalloc, cudaFree, cudaMemset, cudaMemcpy, cudaIpcGetMemHandle,
    cudaIpcOpenMemHandle, cudaIpcCloseMemHandle)}


class _Function:
    """One exported function: restype/argtypes are kept (the wrapper sets them) and the call
    goes to the running rank's driver."""

    def __init__(self, lib: str, name: str) -> None:
        self.__name__ = name
        self.restype: Any = ctypes.c_int
        self.argtypes: Any = None
        self.errcheck: Any = None
        self._impl = SERVED.get(name)
        self._lib = lib

    def __call__(self, *args: Any) -> Any:
        if self._impl is None:
            raise NotImplementedError(f"commsim hosting: {self._lib}:{self.__name__} is not simulated")
        return self._impl(*args)


class SimCudart:
    def __init__(self, name: str) -> None:
        self._name = name
        self._funcs: dict[str, _Function] = {}

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        f = self._funcs.get(name)
        if f is None:
            f = self._funcs[name] = _Function(os.path.basename(self._name), name)
        return f

    def __getitem__(self, name: str) -> Any:
        return getattr(self, name)

    def __repr__(self) -> str:
        return f"<commsim simulated {os.path.basename(self._name)}>"


def _is_cudart(name: Any) -> bool:
    return isinstance(name, str) and os.path.basename(name).startswith("libcudart")


def _map_library() -> None:
    """A real file named libcudart.so.12, mapped, so /proc/self/maps lists it by name."""
    d = tempfile.mkdtemp(prefix="commsim-cudart-")
    path = os.path.join(d, LIBNAME)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.write(fd, b"\0" * mmap.PAGESIZE)
        _state["map"] = mmap.mmap(fd, mmap.PAGESIZE, prot=mmap.PROT_READ)
    finally:
        os.close(fd)
    _state["dir"] = d
    pid = os.getpid()
    atexit.register(lambda: os.getpid() == pid and shutil.rmtree(d, ignore_errors=True))


def _install() -> None:
    real = ctypes.CDLL

    class CDLL(real):   # type: ignore[misc, valid-type]
        def __new__(cls, name: Any, *args: Any, **kwargs: Any) -> Any:
            if _is_cudart(name) and hosted() is not None:
                return SimCudart(name)
            return super().__new__(cls)

    CDLL.__name__ = CDLL.__qualname__ = "CDLL"
    _state["real"] = real
    ctypes.CDLL = CDLL   # type: ignore[misc]
    _map_library()


def _uninstall() -> None:
    ctypes.CDLL = _state.pop("real")   # type: ignore[misc]
    m = _state.pop("map", None)
    if m is not None:
        m.close()
    shutil.rmtree(_state.pop("dir", ""), ignore_errors=True)


if importlib.util.find_spec("commsim.hosting.cudart") is None:
    register_surface("cudart", _install, _uninstall)
