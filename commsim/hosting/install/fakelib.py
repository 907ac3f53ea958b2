"""Shared libraries served to ctypes: what `ctypes.CDLL(path)` returns for a simulated one.

Serving stacks reach libcudart and libnvidia-ml through ctypes (vLLM's and FlashInfer's
`CudaRTLibrary`, nvidia-ml-py's `pynvml`). commsim interposes `ctypes.CDLL` (and
`ctypes.cdll.LoadLibrary`, and pynvml's own `CDLL` name) for the simulated libraries only:
every other library loads as usual.

A served library hands out function objects that behave like ctypes foreign functions:
`restype`, `argtypes` and `errcheck` are honoured, arguments are checked with
`argtype.from_param` (a wrong type raises ctypes.ArgumentError as ctypes does), and each
argument reaches the C-level implementation as the raw value the C function would see: an
integer, an address (for byref(), pointers, arrays, buffers) or the bytes of a struct
passed by value. Implementations write results through those addresses, as C does.
"""

from __future__ import annotations

import ctypes
import os
import sys
import threading
from typing import Any, Callable

from commsim.hosting.install.patches import Patches

_lock = threading.RLock()
_real_cdll = ctypes.CDLL
# soname prefix -> (factory, the running rank or None)
_served: dict[str, tuple[Callable[[str], "FakeLibrary"], Callable[[], Any]]] = {}
_paths: dict[str, str] = {}                               # our real file path -> prefix


class FakeLibrary:
    """A simulated shared library: attribute lookup gives its functions, like a CDLL."""

    def __init__(self, name: str, functions: dict[str, Callable[..., Any]],
                 has_symbol: Callable[[str], bool], not_simulated: Callable[[str], Callable[..., Any]]):
        self._name = name
        self._functions = functions
        self._has_symbol = has_symbol
        self._not_simulated = not_simulated
        self._made: dict[str, FakeFunction] = {}

    def __getattr__(self, name: str) -> "FakeFunction":
        if name.startswith("__"):
            raise AttributeError(name)
        return self[name]

    def __getitem__(self, name: str) -> "FakeFunction":
        f = self._made.get(name)
        if f is None:
            impl = self._functions.get(name)
            if impl is None:
                if not self._has_symbol(name):
                    # dlsym's message, as ctypes reports a missing symbol
                    raise AttributeError(f"{self._name}: undefined symbol: {name}")
                impl = self._not_simulated(name)
            f = self._made[name] = FakeFunction(name, impl)
            self.__dict__[name] = f      # ctypes caches functions as attributes too
        return f

    def __repr__(self) -> str:
        return f"<commsim simulated library '{self._name}'>"


def _address(a: Any) -> int:
    """The address a pointer-like argument carries."""
    if isinstance(a, (ctypes.Array, ctypes.Structure, ctypes.Union)):
        return ctypes.addressof(a)
    if isinstance(a, bytes):
        return ctypes.cast(ctypes.c_char_p(a), ctypes.c_void_p).value or 0
    return ctypes.cast(a, ctypes.c_void_p).value or 0


def raw(a: Any, argtype: Any = None) -> Any:
    """What the C function receives for one Python/ctypes argument."""
    if a is None:
        return 0
    if isinstance(argtype, type) and issubclass(argtype, (ctypes.Structure, ctypes.Union)) \
            and isinstance(a, (ctypes.Structure, ctypes.Union)):
        return ctypes.string_at(ctypes.addressof(a), ctypes.sizeof(a))     # by value
    if isinstance(a, bool):
        return int(a)
    if isinstance(a, int):
        if isinstance(argtype, type) and issubclass(argtype, ctypes._SimpleCData) \
                and argtype._type_ in "bBhHiIlLqQnN?":
            return argtype(a).value          # wrapped to the C width, as ctypes passes it
        return a
    if isinstance(a, ctypes._SimpleCData):
        if a._type_ in "zZPO":               # char*, wchar_t*, void*, PyObject*
            return _address(a)
        return a.value
    return _address(a)


_CONVERTIBLE = (type(None), int, bytes, str, ctypes._SimpleCData, ctypes._Pointer, ctypes.Array,
                ctypes.Structure, ctypes.Union)


class FakeFunction:
    """A foreign function of a FakeLibrary."""

    def __init__(self, name: str, impl: Callable[..., Any]):
        self.__name__ = name
        self._impl = impl
        self.restype: Any = ctypes.c_int        # ctypes' default
        self.argtypes: Any = None
        self.errcheck: Any = None

    def __call__(self, *args: Any) -> Any:
        argtypes = self.argtypes
        if argtypes is not None:
            if len(args) < len(argtypes):
                raise TypeError(f"this function takes at least {len(argtypes)} argument"
                                f"{'s' if len(argtypes) != 1 else ''} ({len(args)} given)")
            for i, (t, a) in enumerate(zip(argtypes, args)):
                try:
                    t.from_param(a)
                except Exception as e:       # what ctypes raises for a wrong argument
                    raise ctypes.ArgumentError(f"argument {i + 1}: {type(e).__name__}: {e}") from None
        types = list(argtypes or []) + [None] * (len(args) - len(argtypes or []))
        raws = []
        for i, (a, t) in enumerate(zip(args, types)):
            a = getattr(a, "_as_parameter_", a)
            if t is None and not isinstance(a, _CONVERTIBLE) and type(a).__name__ != "CArgObject":
                # ctypes' message for an argument it cannot pass without argtypes
                raise ctypes.ArgumentError(f"argument {i + 1}: TypeError: Don't know how to "
                                           f"convert parameter {i + 1}")
            raws.append(raw(a, t))
        result = self._impl(*raws)
        result = self._convert(result)
        if self.errcheck is not None:
            result = self.errcheck(result, self, args)
        return result

    def _convert(self, result: Any) -> Any:
        rt = self.restype
        if rt is None:
            return None
        if isinstance(result, bytes):            # a `const char*` return
            if rt is ctypes.c_char_p:
                return result
            addr = _static_string(result)
            return addr if rt is ctypes.c_void_p else ctypes.c_int(addr).value
        if isinstance(rt, type) and issubclass(rt, ctypes._SimpleCData):
            return rt(int(result)).value
        return rt(int(result)) if callable(rt) else result

    def __repr__(self) -> str:
        return f"<commsim simulated function {self.__name__}>"


_strings: dict[bytes, Any] = {}


def _static_string(b: bytes) -> int:
    """A stable address for a returned C string (real libraries return static storage)."""
    buf = _strings.get(b)
    if buf is None:
        buf = _strings[b] = ctypes.create_string_buffer(b)
    return ctypes.addressof(buf)


# ---- ctypes.CDLL interposition -------------------------------------------------------------

def serve(patches: Patches, soname_prefix: str, factory: Callable[[str], FakeLibrary],
          rank_of: Callable[[], Any], path: str | None = None) -> None:
    """Serve `factory(name)` for CDLL(name) in a hosted rank (`rank_of()` not None) when
    name's file name starts with the prefix (e.g. "libcudart.so") or name is `path` (a real
    file standing in for it); ctypes itself is interposed while any library is served.
    patches.restore() stops serving it."""
    with _lock:
        _served[soname_prefix] = (factory, rank_of)
        if path is not None:
            _paths[os.path.realpath(path)] = soname_prefix
    _interpose()
    patches.on_restore(lambda: _unserve(soname_prefix))


def _unserve(soname_prefix: str) -> None:
    with _lock:
        _served.pop(soname_prefix, None)
        for p, pre in list(_paths.items()):
            if pre == soname_prefix:
                del _paths[p]
        if not _served:
            _ctypes_patches.restore()


def lookup(name: Any) -> FakeLibrary | None:
    if not isinstance(name, (str, os.PathLike)):
        return None
    name = os.fspath(name)
    prefix = _paths.get(os.path.realpath(name)) if os.sep in name else None
    if prefix is None:
        base = os.path.basename(name)
        prefix = next((p for p in _served if base.startswith(p)), None)
        if prefix is None or (os.sep in name and not os.path.exists(name)):
            return None
    factory, rank_of = _served[prefix]
    if rank_of() is None:
        # Not a hosted rank (the launcher's own threads; a test runner or Ray in the same
        # interpreter after an inproc run): the machine's real libraries, as without commsim.
        return None
    # A new library object per CDLL call, as ctypes gives: restype/argtypes set on one
    # object's functions do not leak into another's.
    return factory(name)


class HostedCDLL(_real_cdll):
    """ctypes.CDLL that returns the simulated library for the served names."""

    def __new__(cls, name: Any, *args: Any, **kwargs: Any) -> Any:
        lib = lookup(name)
        if lib is not None:
            return lib
        return super().__new__(cls)


_ctypes_patches = Patches()


def _interpose() -> None:
    """ctypes.CDLL, ctypes.cdll's loader and pynvml's own CDLL name (it took ctypes' by
    `from ctypes import *`) give HostedCDLL while a library is served."""
    with _lock:
        if _ctypes_patches.holds(ctypes, "CDLL"):
            return
        _ctypes_patches.attr(ctypes, "CDLL", HostedCDLL)
        _ctypes_patches.attr(ctypes.cdll, "_dlltype", HostedCDLL)
        pynvml = sys.modules.get("pynvml")
        if pynvml is not None and hasattr(pynvml, "CDLL"):
            _ctypes_patches.attr(pynvml, "CDLL", HostedCDLL)
