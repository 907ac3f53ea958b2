"""A cuda-python / ctypes-libcudart facade over one simulated process (a Driver).

Serving stacks talk to CUDA in two ways; both can run unchanged against a SimDriver:

- cuda-python: `from cuda.bindings import runtime as cudart` / `import cuda.bindings.driver`.
  `Facade(driver).runtime` and `.driver` are module stand-ins whose API functions are that
  process's Driver methods (cuda* on `runtime`, cu* on `driver`), with everything else (the
  enums `cudaError_t`, `CUresult`, `cudaMemcpyKind`, structs such as `CUmemAllocationProp`,
  constants such as `cudaIpcMemLazyEnablePeerAccess`, the GPU-free `cudaGetErrorString` /
  `cudaGetErrorName`) passed through from the real modules. A real API function the Driver
  does not simulate raises NotImplementedError naming it, rather than reaching for a GPU.
  `cuGetErrorString` / `cuGetErrorName` answer from the runtime table (reference §1.5).

- a ctypes wrapper of libcudart, the kind vLLM (`cuda_wrapper.CudaRTLibrary`) and FlashInfer
  (`comm/cuda_ipc.py`) carry: `CudaRTLibrary` here has the same methods and returns
  (`ctypes.c_void_p` pointers, a 128-byte `cudaIpcMemHandle_t` struct) and raises
  `RuntimeError("CUDART error: <cudaGetErrorString>")` on any failure (reference §1.5, L17).

`patched(driver)` makes `import cuda.bindings.runtime`, `from cuda.bindings import runtime`
and the same for `driver` resolve to the facade for the duration of a `with` block: the
`sys.modules` entries and the attributes of the `cuda.bindings` package are replaced by
dispatchers and restored when the last active block exits.

Greenlets and threads: the dispatchers look up the facade of the *running* greenlet (walking
up its parents, so ranks of a Scheduler started inside a block see that block's facade), so
ranks interleaved by `commsim.runtime.scheduler` may each sit in their own `patched(...)` at the
same time, and other threads keep the real modules. Limitations:
- a name bound from the module (`from cuda.bindings.runtime import cudaMalloc`, or `rt =
  cuda.bindings.runtime`) is bound to the facade current at that moment: a function object
  handed to another rank keeps calling the first rank's process;
- a module reference taken *before* the block (`from cuda.bindings import runtime` at import
  time of user code) is the real module and is not redirected; `cuda.bindings.runtime.X`
  looked up at call time is;
- a module first imported *inside* a block keeps the dispatcher it bound; outside any block
  the dispatcher forwards to the real module, so that is harmless;
- the legacy `cuda.cudart` / `cuda.cuda` module names are not patched.
"""

from __future__ import annotations

import contextlib
import ctypes
import sys
import threading
import types
import weakref
from typing import Any, Iterator

import cuda.bindings as _bindings_pkg
from cuda.bindings import driver as _real_driver
from cuda.bindings import runtime as _real_runtime
from greenlet import getcurrent

from .driver import Driver, error_name, error_string

__all__ = ["Facade", "CudaModule", "CudaRTLibrary", "cudaIpcMemHandle_t", "patched",
           "current_facade"]

RUNTIME = "cuda.bindings.runtime"
DRIVER = "cuda.bindings.driver"
_REAL = {RUNTIME: _real_runtime, DRIVER: _real_driver}

# Real functions that need no GPU and no driver library: passed through unchanged.
_PURE = frozenset({"cudaGetErrorString", "cudaGetErrorName"})


def _protocol_methods() -> tuple[str, ...]:
    return tuple(n for n in dir(Driver) if not n.startswith("_") and callable(getattr(Driver, n)))


def _is_api_function(name: str, value: Any) -> bool:
    return name.startswith("cu") and callable(value) and not isinstance(value, type)


class CudaModule(types.ModuleType):
    """One process's `cuda.bindings.runtime` (runtime=True) or `cuda.bindings.driver`."""

    def __init__(self, driver: Driver, runtime: bool):
        name = RUNTIME if runtime else DRIVER
        real = _REAL[name]
        super().__init__(name, real.__doc__)
        self.__file__ = getattr(real, "__file__", None)
        self._real = real
        self._driver = driver
        names = _protocol_methods() + tuple(
            n for n in dir(driver) if n.startswith("cu") and not n.startswith("_"))
        mine = [n for n in names if n.startswith("cuda") == runtime and n.startswith("cu")]
        for n in set(mine):
            if hasattr(driver, n):
                setattr(self, n, getattr(driver, n))
        if not runtime:
            self.cuGetErrorString = _cu_error_string
            self.cuGetErrorName = _cu_error_name

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._real, name)   # AttributeError as the real module gives it
        if _is_api_function(name, value) and name not in _PURE:
            return _not_simulated(self.__name__, name)
        return value

    def __dir__(self) -> list[str]:
        return sorted(set(dir(self._real)) | set(self.__dict__))

    def __repr__(self) -> str:
        return f"<commsim facade {self.__name__} for {self._driver!r}>"


def _not_simulated(module: str, name: str):
    def call(*args: Any, **kwargs: Any):
        raise NotImplementedError(
            f"commsim facade: {module}.{name} is not simulated (the Driver protocol, "
            f"commsim/driver.py, has no such call)")
    call.__name__ = name
    return call


def _cu_error_string(error: Any) -> tuple:
    # Driver texts are UNCONFIRMED (reference §1.5): the runtime string of the same number.
    return (_real_driver.CUresult.CUDA_SUCCESS, error_string(error).encode())


def _cu_error_name(error: Any) -> tuple:
    try:
        name = _real_driver.CUresult(int(error)).name
    except ValueError:
        return (_real_driver.CUresult.CUDA_ERROR_INVALID_VALUE, None)
    return (_real_driver.CUresult.CUDA_SUCCESS, name.encode())


# ---- the ctypes-libcudart wrapper ------------------------------------------------------------

class cudaIpcMemHandle_t(ctypes.Structure):
    """As vLLM / FlashInfer declare it: 128 opaque bytes (the CUDA struct is 64, §1.1)."""

    _fields_ = [("internal", ctypes.c_byte * 128)]


def _ptr(p: Any) -> int:
    if isinstance(p, ctypes.c_void_p):
        return p.value or 0
    return int(p) if p is not None else 0


class CudaRTLibrary:
    """vLLM's `CudaRTLibrary` surface over one simulated process (no libcudart is loaded).

    `CudaRTLibrary()` inside a `patched(driver)` block takes that block's process, so code
    that builds its own wrapper works unchanged; or pass the Driver explicitly.
    """

    def __init__(self, driver: Driver | None = None, so_file: str | None = None):
        if driver is None:
            f = current_facade()
            if f is None:
                raise RuntimeError("CudaRTLibrary() outside commsim.facade.patched(...): pass "
                                   "the simulated process's Driver")
            driver = f.process
        self.driver = driver
        self.so_file = so_file or "<commsim simulated libcudart>"

    def CUDART_CHECK(self, result: Any) -> Any:
        err, rest = result[0], result[1:]
        if int(err) != 0:
            raise RuntimeError(f"CUDART error: {self.cudaGetErrorString(err)}")
        return rest[0] if len(rest) == 1 else (rest or None)

    def cudaGetErrorString(self, error: Any) -> str:
        return error_string(error)

    def cudaGetErrorName(self, error: Any) -> str:
        return error_name(error)

    def cudaSetDevice(self, device: int) -> None:
        self.CUDART_CHECK(self.driver.cudaSetDevice(device))

    def cudaGetDevice(self) -> int:
        return self.CUDART_CHECK(self.driver.cudaGetDevice())

    def cudaDeviceSynchronize(self) -> None:
        self.CUDART_CHECK(self.driver.cudaDeviceSynchronize())

    def cudaMalloc(self, size: int) -> ctypes.c_void_p:
        return ctypes.c_void_p(self.CUDART_CHECK(self.driver.cudaMalloc(size)))

    def cudaFree(self, devPtr: Any) -> None:
        self.CUDART_CHECK(self.driver.cudaFree(_ptr(devPtr)))

    def cudaMemset(self, devPtr: Any, value: int, count: int) -> None:
        self.CUDART_CHECK(self.driver.cudaMemset(_ptr(devPtr), value, count))

    def cudaMemcpy(self, dst: Any, src: Any, count: int) -> None:
        """cudaMemcpyDefault between device addresses of this process (host pointers are
        not simulated: the simulated device address space is not the host's)."""
        self.CUDART_CHECK(self.driver.cudaMemcpy(_ptr(dst), _ptr(src), count,
                                                 _real_runtime.cudaMemcpyKind.cudaMemcpyDefault))

    def cudaIpcGetMemHandle(self, devPtr: Any) -> cudaIpcMemHandle_t:
        blob = self.CUDART_CHECK(self.driver.cudaIpcGetMemHandle(_ptr(devPtr)))
        h = cudaIpcMemHandle_t()
        ctypes.memmove(ctypes.addressof(h), bytes(blob), min(len(blob), ctypes.sizeof(h)))
        return h

    def cudaIpcOpenMemHandle(self, handle: Any) -> ctypes.c_void_p:
        raw = bytes(memoryview(handle))[:64] if not isinstance(handle, bytes) else handle
        return ctypes.c_void_p(self.CUDART_CHECK(self.driver.cudaIpcOpenMemHandle(
            raw, _real_runtime.cudaIpcMemLazyEnablePeerAccess)))

    def cudaIpcCloseMemHandle(self, devPtr: Any) -> None:
        self.CUDART_CHECK(self.driver.cudaIpcCloseMemHandle(_ptr(devPtr)))


# ---- the per-process facade ------------------------------------------------------------------

class Facade:
    """What one simulated process sees as CUDA: `.runtime`, `.driver` (module stand-ins),
    `.cudart` (the ctypes-style wrapper), and `.process` (the Driver itself)."""

    def __init__(self, driver: Driver):
        self.process = driver
        self.runtime = CudaModule(driver, runtime=True)
        self.driver = CudaModule(driver, runtime=False)
        self.cudart = CudaRTLibrary(driver)

    def module(self, name: str) -> CudaModule:
        return self.runtime if name == RUNTIME else self.driver

    def __repr__(self) -> str:
        return f"<commsim Facade for {self.process!r}>"


# ---- patching ------------------------------------------------------------------------------

_lock = threading.RLock()
_active: "weakref.WeakKeyDictionary[Any, list[Facade]]" = weakref.WeakKeyDictionary()
_installed = 0
_saved: dict[str, Any] = {}


def current_facade() -> Facade | None:
    """The facade of the innermost `patched` block of this greenlet (or of a parent
    greenlet), None when there is none."""
    g = getcurrent()
    while g is not None:
        stack = _active.get(g)
        if stack:
            return stack[-1]
        g = g.parent
    return None


class _Dispatch(types.ModuleType):
    """What sys.modules holds while any `patched` block is active: forwards every attribute
    to the running greenlet's facade module, or to the real module where there is none."""

    def __init__(self, name: str):
        super().__init__(name, _REAL[name].__doc__)
        self.__file__ = getattr(_REAL[name], "__file__", None)
        self._target = name

    def __getattr__(self, attr: str) -> Any:
        f = current_facade()
        return getattr(f.module(self._target) if f is not None else _REAL[self._target], attr)

    def __dir__(self) -> list[str]:
        f = current_facade()
        return dir(f.module(self._target) if f is not None else _REAL[self._target])

    def __repr__(self) -> str:
        return f"<commsim facade dispatcher for {self._target}>"


_DISPATCH = {RUNTIME: _Dispatch(RUNTIME), DRIVER: _Dispatch(DRIVER)}


def _install() -> None:
    global _installed
    if _installed == 0:
        for name, disp in _DISPATCH.items():
            attr = name.rsplit(".", 1)[1]
            _saved[name] = (sys.modules.get(name), _bindings_pkg.__dict__.get(attr, _MISSING))
            sys.modules[name] = disp
            setattr(_bindings_pkg, attr, disp)
    _installed += 1


def _uninstall() -> None:
    global _installed
    _installed -= 1
    if _installed == 0:
        for name in _DISPATCH:
            attr = name.rsplit(".", 1)[1]
            mod, pkg_attr = _saved.pop(name)
            if mod is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = mod
            if pkg_attr is _MISSING:
                _bindings_pkg.__dict__.pop(attr, None)
            else:
                setattr(_bindings_pkg, attr, pkg_attr)


_MISSING = object()


@contextlib.contextmanager
def patched(driver: Driver | Facade) -> Iterator[Facade]:
    """Within the block, cuda-python imports in this greenlet (and greenlets it starts)
    resolve to `driver`'s facade; yields the Facade."""
    f = driver if isinstance(driver, Facade) else Facade(driver)
    g = getcurrent()
    with _lock:
        _install()
        _active.setdefault(g, []).append(f)
    try:
        yield f
    finally:
        with _lock:
            stack = _active.get(g)
            if stack:
                stack.remove(f)
                if not stack:
                    del _active[g]
            _uninstall()
