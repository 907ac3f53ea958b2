"""The argument conversion of cuda-python's bindings, mirrored by the simulated driver.

Before a real `cuda.bindings` call reaches CUDA, its Cython wrapper converts every argument to
the C type of the parameter, and what does not convert is rejected there with a Python
exception: `cudaMalloc("4096")` raises TypeError, `cudaMalloc(float("inf"))` OverflowError,
`cudaMalloc(float("nan"))` ValueError, `cudaMalloc(-1)` OverflowError, while
`cudaMalloc(4096.7)` converts (to 4096) and reaches the driver. SimDriver applies the same
conversion, per parameter, before its own rules run (what the real binding rejects, the
simulator rejects the same way), so an argument that gets past this layer
gets a CUDA error code, never an exception from inside the simulator.

One layer for the three places that take a binding's arguments: SimDriver (@api applies
SIGNATURES), device/driver.py's CudaDriver (the same SIGNATURES, so the real-GPU driver and the
simulator answer one call alike) and the hosted `cuda.bindings` stand-ins (BINDINGS, applied
by commsim/hosting/state/cuda_state.api_call before the driver's entry rules, as the binding
converts before anything reaches CUDA).

Source: cuda-python (cuda-bindings 13.x) as installed, observed by calling each binding with
each kind of value on a machine without a driver (a value that converts reaches the library
load); tests/conformance/test_binding_args.py repeats that comparison for every entry of
SIGNATURES and tests/unit/test_binding_conversion_diff.py for every function, parameter and
kind of value across the three, so a binding that changes its conversion fails the suite.
"""

from __future__ import annotations

from typing import Any, Callable

from cuda.bindings import driver as cu
from cuda.bindings import runtime as rt

U64 = 1 << 64


def _c_integer(obj: Any, ctype: str, low: int, high: int) -> int:
    # Cython's C-integer conversion: an int (bool, numpy ints) as is, otherwise the object's
    # __int__ (a float truncates; inf raises OverflowError, nan ValueError, as int() does);
    # str, bytes, None and containers are "an integer is required".
    if isinstance(obj, int):
        n = int(obj)
    elif isinstance(obj, (str, bytes, bytearray)) or not hasattr(type(obj), "__int__"):
        raise TypeError("an integer is required")
    else:
        n = int(obj)
    if n < low:
        raise OverflowError(f"can't convert negative value to {ctype}" if low == 0
                            else f"value too small to convert to {ctype}")
    if n > high:
        raise OverflowError(f"value too large to convert to {ctype}")
    return n


# Each converter first takes a plain int in range as is (the answer the general path gives
# it, without its calls: every simulated driver call converts its arguments, a few hundred per
# generated scenario).
def size_t(obj: Any) -> int:
    """`size_t` and `unsigned long long` parameters."""
    if type(obj) is int and 0 <= obj < U64:
        return obj
    return _c_integer(obj, "size_t", 0, U64 - 1)


def c_int(obj: Any) -> int:
    """`int` parameters (cudaSetDevice's device, cudaMemset's value)."""
    if type(obj) is int and -(1 << 31) <= obj < (1 << 31):
        return obj
    return _c_integer(obj, "int", -(1 << 31), (1 << 31) - 1)


def c_ushort(obj: Any) -> int:
    """`unsigned short` parameters (cuMemsetD16's value)."""
    return _c_integer(obj, "unsigned short", 0, 0xFFFF)


def c_uchar(obj: Any) -> int:
    """`unsigned char` parameters (cuMemsetD8's value: 4096.7 converts to 4096, too large)."""
    return _c_integer(obj, "unsigned char", 0, 0xFF)


def c_uint(obj: Any) -> int:
    """`unsigned int` parameters (cudaIpcOpenMemHandle's flags)."""
    if type(obj) is int and 0 <= obj < (1 << 32):
        return obj
    return _c_integer(obj, "unsigned int", 0, (1 << 32) - 1)


def cu_device(obj: Any) -> int:
    """CUdevice parameters: None is device 0, otherwise a C int."""
    if type(obj) is int and -(1 << 31) <= obj < (1 << 31):
        return obj
    return 0 if obj is None else c_int(obj)


def cu_value(obj: Any) -> int:
    """CUdeviceptr and CUmemGenericAllocationHandle parameters of the driver API: None is 0, a
    wrapper object gives its int, otherwise a size_t."""
    if type(obj) is int and 0 <= obj < U64:
        return obj
    if obj is None:
        return 0
    if hasattr(obj, "getPtr") and not isinstance(obj, (int, float)):
        return size_t(int(obj))
    return size_t(obj)


def _is_buffer(obj: Any) -> bool:
    """Whether `obj` is taken as a host buffer (the buffer protocol: bytes, numpy arrays,
    ctypes arrays) rather than a number."""
    if isinstance(obj, (bytes, bytearray, memoryview)):
        return True
    if isinstance(obj, (str, int, float)) or hasattr(type(obj), "__int__"):
        return False
    try:
        memoryview(obj)
    except TypeError:
        return False
    return True


def _not_a_pointer(obj: Any) -> TypeError:
    return TypeError(f"Provided argument is of type {type(obj)} but expected Type {type(None)}, "
                     f"{type} or object with Buffer Protocol")


def dev_ptr(obj: Any) -> int:
    """`devPtr`-style void* parameters of the runtime API (and cuMemImportFromShareableHandle's
    osHandle): None, an int in 0..2**64-1, a float or numpy scalar (converted with int()), an
    object with getPtr(), or a buffer (its address: the simulator knows no such pointer, so
    -1, which no mapping holds). Anything else, a negative or too large int included, is a
    TypeError, as cuda-python's _HelperInputVoidPtr raises."""
    if type(obj) is int and 0 <= obj < U64:
        return obj
    if obj is None:
        return 0
    if hasattr(obj, "getPtr") and not isinstance(obj, (int, float)):
        return int(obj.getPtr())
    if _is_buffer(obj):
        return -1
    if isinstance(obj, (str, list, tuple, dict)) or not hasattr(type(obj), "__int__"):
        raise _not_a_pointer(obj)
    try:
        n = int(obj)
    except (OverflowError, ValueError):
        raise _not_a_pointer(obj) from None
    if not 0 <= n < U64:
        raise _not_a_pointer(obj)
    return n


def void_arg(obj: Any) -> Any:
    """A `void*` parameter whose object the callee still needs (a host buffer to copy from or
    into, a FABRIC handle's 64 bytes, an object with getPtr()): rejected as dev_ptr rejects,
    and then a buffer or a getPtr() object passed on as given, a number as its int."""
    n = dev_ptr(obj)
    if obj is None or isinstance(obj, int) and not isinstance(obj, bool):
        return n
    if _is_buffer(obj) or hasattr(obj, "getPtr"):
        return obj
    return n


def os_handle(obj: Any) -> Any:
    """cuMemImportFromShareableHandle's osHandle: an fd as its int, a FABRIC handle as the 64
    bytes themselves (void_arg)."""
    return void_arg(obj)


def struct(cls: type, pname: str, optional: bool = False) -> Callable[[Any], Any]:
    """A struct parameter (`CUmemAllocationProp prop`): an instance of `cls`, or None where the
    binding's signature says Optional; anything else is the binding's TypeError."""
    def conv(obj: Any) -> Any:
        if isinstance(obj, cls) or (optional and obj is None):
            return obj
        raise TypeError(f"Argument '{pname}' has incorrect type (expected {cls.__module__}."
                        f"{cls.__name__}, got {type(obj).__name__})")
    conv.__name__ = f"struct_{cls.__name__}"
    conv.cls = cls        # type: ignore[attr-defined]
    return conv


def struct_list(cls: type, pname: str, comma: str = "") -> Callable[[Any], Any]:
    """A list-of-structs parameter (cuMemSetAccess's desc): None, or a list or tuple whose
    every element is an instance of `cls` (`comma`: the binding's message spells some of these
    types with a trailing comma)."""
    def conv(obj: Any) -> Any:
        if obj is None:
            return obj
        if not isinstance(obj, (list, tuple)):
            iter(obj)                          # "'int' object is not iterable", as the binding
        if isinstance(obj, (list, tuple)) and all(isinstance(x, cls) for x in obj):
            return obj
        raise TypeError(f"Argument '{pname}' is not instance of type (expected "
                        f"tuple[cydriver.{cls.__name__}{comma}] or "
                        f"list[cydriver.{cls.__name__}{comma}]")
    conv.__name__ = f"list_{cls.__name__}"
    return conv


def enum_member(cls: type, pname: str) -> Callable[[Any], Any]:
    """An enum parameter the binding reads through `.value` (cuMemExportToShareableHandle's
    handleType, cuPointerGetAttribute's attribute): None is refused by name, an object without
    `.value` (a plain int) raises AttributeError there, and so here; the member is passed on.
    The binding reads it after converting the call's other parameters (a bad flags value is
    its OverflowError even when handleType is an int), so it is converted last."""
    def conv(obj: Any) -> Any:
        if obj is None:
            raise TypeError(f"Argument '{pname}' must not be None")
        obj.value                              # AttributeError as the binding's
        return obj
    conv.__name__ = f"enum_member_{pname}"
    conv.cls = cls        # type: ignore[attr-defined]
    conv.late = True      # type: ignore[attr-defined]  # read after the other parameters
    return conv


def enum32(obj: Any) -> int:
    """Enum parameters (CUdevice_attribute, cudaMemcpyKind, granularity options): the binding
    takes int(value), so a numeric str converts and other strs raise ValueError, and the
    result must fit 32 bits."""
    n = int(obj)
    if not -(1 << 31) <= n < (1 << 32):
        raise OverflowError(f"value {n} does not fit the enum's 32 bits")
    return n


def passthrough(obj: Any) -> Any:
    """Structs and handle-type enums: the Driver protocol (commsim/driver.py) takes these as
    the simulator's own values (handle bytes, int handle types, prop objects); the simulator
    answers a code for anything it cannot read."""
    return obj


Conv = Callable[[Any], Any]
P, S, I, U, D, V, E, X = passthrough, size_t, c_int, c_uint, cu_device, cu_value, enum32, dev_ptr
H = os_handle

# Method -> converter per positional parameter, from the real binding's signature (its
# docstring's first line, e.g. `cuMemMap(ptr, size_t size, size_t offset, handle,
# unsigned long long flags)`). Declared once here; SimDriver's @api applies it.
SIGNATURES: dict[str, tuple[Conv, ...]] = {
    "cudaGetDeviceCount": (),
    "cudaGetDevice": (),
    "cudaSetDevice": (I,),
    "cudaDeviceSynchronize": (),
    "cudaDeviceReset": (),
    "cuDevicePrimaryCtxReset": (D,),
    "cuDeviceGetAttribute": (E, D),
    "cuDeviceCanAccessPeer": (D, D),
    "cudaDeviceCanAccessPeer": (I, I),
    "cudaMalloc": (S,),
    "cudaFree": (X,),
    "cudaMemcpy": (X, X, S, E),
    "cudaMemset": (X, I, S),
    "memcpy_htod": (X, P),           # the protocol's host-array form of cudaMemcpy
    "memcpy_dtoh": (X, S),
    "cudaIpcGetMemHandle": (X,),
    "cudaIpcOpenMemHandle": (P, U),
    "cudaIpcCloseMemHandle": (X,),
    "cuMemGetAllocationGranularity": (P, E),
    "cuMemCreate": (S, P, S),
    "cuMemExportToShareableHandle": (V, P, S),
    "cuMemImportFromShareableHandle": (H, P),
    "cuMemAddressReserve": (S, S, V, S),
    "cuMemMap": (V, S, S, V, S),
    "cuMemSetAccess": (V, S, P, S),
    "cuMemUnmap": (V, S),
    "cuMemRelease": (V,),
    "cuMemAddressFree": (V, S),
    "cuMulticastGetGranularity": (P, E),
    "cuMulticastCreate": (P,),
    "cuMulticastAddDevice": (V, D),
    "cuMulticastBindMem": (V, S, V, S, S, S),
    "cuMulticastUnbind": (V, D, S, S),
}


# The real binding's functions that hosted programs call (commsim/hosting/surfaces/cuda), each
# parameter's conversion from the binding's signature line. Same converters as SIGNATURES;
# what differs is the struct parameters (the binding's classes here, the simulator's own
# values there) and the void* ones (here the caller's buffer is passed on).
W = void_arg
U8, U16 = c_uchar, c_ushort
_PROP, _MC_PROP = struct(cu.CUmemAllocationProp, "prop", True), struct(cu.CUmulticastObjectProp, "prop", True)
BINDINGS: dict[str, tuple[Conv, ...]] = {
    # cuda.bindings.runtime
    "cudaDeviceCanAccessPeer": (I, I), "cudaDeviceDisablePeerAccess": (I,),
    "cudaDeviceEnablePeerAccess": (I, U), "cudaDeviceGetAttribute": (E, I),
    "cudaDeviceGetPCIBusId": (I, I), "cudaDeviceReset": (), "cudaDeviceSynchronize": (), "cudaDriverGetVersion": (),
    "cudaFree": (W,), "cudaGetDevice": (), "cudaGetDeviceCount": (),
    "cudaGetDeviceProperties": (I,), "cudaGetLastError": (), "cudaIpcCloseMemHandle": (W,),
    "cudaIpcGetMemHandle": (W,), "cudaIpcOpenMemHandle": (struct(rt.cudaIpcMemHandle_t, "handle"), U),
    "cudaMalloc": (S,), "cudaMemGetInfo": (), "cudaMemcpy": (W, W, S, E),
    "cudaMemcpyAsync": (W, W, S, E, V), "cudaMemset": (W, I, S), "cudaMemsetAsync": (W, I, S, V),
    "cudaPeekAtLastError": (), "cudaPointerGetAttributes": (W,), "cudaRuntimeGetVersion": (),
    "cudaSetDevice": (I,), "cudaStreamCreate": (), "cudaStreamCreateWithFlags": (U,),
    "cudaStreamDestroy": (V,), "cudaStreamSynchronize": (V,),
    # cuda.bindings.driver
    "cuCtxGetCurrent": (), "cuCtxGetDevice": (), "cuCtxSetCurrent": (V,), "cuCtxSynchronize": (),
    "cuDeviceCanAccessPeer": (D, D), "cuDeviceGet": (I,), "cuDeviceGetAttribute": (E, D),
    "cuDeviceGetCount": (), "cuDeviceGetName": (I, D), "cuDeviceGetPCIBusId": (I, D),
    "cuDevicePrimaryCtxRelease": (D,), "cuDevicePrimaryCtxReset": (D,), "cuDevicePrimaryCtxRetain": (D,), "cuDeviceTotalMem": (D,),
    "cuDriverGetVersion": (), "cuGetErrorName": (E,), "cuGetErrorString": (E,), "cuInit": (U,),
    "cuIpcCloseMemHandle": (V,), "cuIpcGetMemHandle": (V,),
    "cuIpcOpenMemHandle": (struct(cu.CUipcMemHandle, "handle"), U), "cuMemAddressFree": (V, S),
    "cuMemAddressReserve": (S, S, V, S), "cuMemAlloc": (S,), "cuMemCreate": (S, _PROP, S),
    "cuMemExportToShareableHandle": (V, enum_member(cu.CUmemAllocationHandleType, "handleType"), S),
    "cuMemFree": (V,), "cuMemGetAddressRange": (V,),
    "cuMemGetAllocationGranularity": (_PROP, E), "cuMemGetInfo": (),
    "cuMemImportFromShareableHandle": (H, E), "cuMemMap": (V, S, S, V, S), "cuMemRelease": (V,),
    "cuMemSetAccess": (V, S, struct_list(cu.CUmemAccessDesc, "desc", ","), S), "cuMemUnmap": (V, S),
    "cuMemcpy": (V, V, S), "cuMemcpyDtoD": (V, V, S), "cuMemcpyDtoH": (W, V, S),
    "cuMemcpyHtoD": (V, W, S), "cuMemsetD16": (V, U16, S), "cuMemsetD32": (V, U, S),
    "cuMemsetD8": (V, U8, S), "cuMulticastAddDevice": (V, D),
    "cuMulticastBindMem": (V, S, V, S, S, S), "cuMulticastCreate": (_MC_PROP,),
    "cuMulticastGetGranularity": (_MC_PROP, E), "cuMulticastUnbind": (V, D, S, S),
    "cuPointerGetAttribute": (enum_member(cu.CUpointer_attribute, "attribute"), V),
    "cuPointerGetAttributes": (U, struct_list(cu.CUpointer_attribute, "attributes"), V),
    "cuStreamCreate": (U,), "cuStreamDestroy": (V,), "cuStreamSynchronize": (V,),
}


# Calls whose count parameter says how many entries a list parameter has: (list index, count
# index). The binding refuses a count past the list's length (None is empty) with RuntimeError
# "List is too small" before anything reaches CUDA.
LIST_COUNTS: dict[str, tuple[int, int]] = {"cuMemSetAccess": (2, 3), "cuPointerGetAttributes": (1, 0)}


def check_list_count(name: str, args: tuple) -> tuple:
    """`args` (converted) unchanged, or the binding's RuntimeError for a count past its list."""
    at = LIST_COUNTS.get(name)
    if at is not None:
        items, count = args[at[0]], args[at[1]]
        n = 0 if items is None else len(items)
        if isinstance(count, int) and count > n:
            raise RuntimeError(f"List is too small: {n} < {count}")
    return args


def converter(sig: tuple[Conv, ...], name: str = "") -> Callable[[tuple], tuple]:
    """One function applying `sig`'s converters to a call's arguments (their count checked
    already), then check_list_count for `name`. Written out per arity: a call per argument
    from Python code costs about half of one made from map() or a comprehension, and every
    simulated driver call converts (a few hundred per generated scenario)."""
    if name in LIST_COUNTS:
        plain = converter(sig)
        return lambda a: check_list_count(name, plain(a))
    n = len(sig)
    if n == 1:
        (c0,) = sig
        return lambda a: (c0(a[0]),)
    if n == 2:
        c0, c1 = sig
        return lambda a: (c0(a[0]), c1(a[1]))
    if n == 3:
        c0, c1, c2 = sig
        return lambda a: (c0(a[0]), c1(a[1]), c2(a[2]))
    if n == 4:
        c0, c1, c2, c3 = sig
        return lambda a: (c0(a[0]), c1(a[1]), c2(a[2]), c3(a[3]))
    if n == 5:
        c0, c1, c2, c3, c4 = sig
        return lambda a: (c0(a[0]), c1(a[1]), c2(a[2]), c3(a[3]), c4(a[4]))
    return lambda a: tuple([c(x) for c, x in zip(sig, a)])


def convert(name: str, args: tuple) -> tuple:
    """`args` as the binding of `name` would pass them on; raises what the binding raises for
    an argument it cannot convert. A call with the wrong number of arguments is a TypeError,
    as for any Python function."""
    sig = SIGNATURES.get(name)
    if sig is None:
        return args
    if len(args) != len(sig):
        raise TypeError(f"{name}() takes {len(sig)} positional arguments but {len(args)} "
                        f"were given")
    return check_list_count(name, tuple([conv(a) for conv, a in zip(sig, args)]))
