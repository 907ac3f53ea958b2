"""The argument conversion of cuda-python's bindings, mirrored by the simulated driver.

Before a real `cuda.bindings` call reaches CUDA, its Cython wrapper converts every argument to
the C type of the parameter, and what does not convert is rejected there with a Python
exception: `cudaMalloc("4096")` raises TypeError, `cudaMalloc(float("inf"))` OverflowError,
`cudaMalloc(float("nan"))` ValueError, `cudaMalloc(-1)` OverflowError, while
`cudaMalloc(4096.7)` converts (to 4096) and reaches the driver. SimDriver applies the same
conversion, per parameter, before its own rules run (what the real binding rejects, the
simulator rejects the same way), so an argument that gets past this layer
gets a CUDA error code, never an exception from inside the simulator.

Source: cuda-python (cuda-bindings 13.x) as installed, observed by calling each binding with
each kind of value on a machine without a driver (a value that converts reaches the library
load); tests/conformance/test_binding_args.py repeats that comparison for every entry of
SIGNATURES, so a binding that changes its conversion fails the suite.
"""

from __future__ import annotations

from typing import Any, Callable

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
    if isinstance(obj, (bytes, bytearray, memoryview)):
        return -1
    if isinstance(obj, (str, list, tuple, dict)) or not hasattr(type(obj), "__int__"):
        raise TypeError(f"Provided argument is of type {type(obj)} but expected a pointer "
                        f"(None, int, or an object with getPtr())")
    try:
        n = int(obj)
    except (OverflowError, ValueError):
        raise TypeError(f"Provided argument is of type {type(obj)} but expected a pointer "
                        f"(None, int, or an object with getPtr())") from None
    if not 0 <= n < U64:
        raise TypeError(f"Provided argument is of type {type(obj)} but expected a pointer "
                        f"(None, int, or an object with getPtr())")
    return n


def os_handle(obj: Any) -> Any:
    """cuMemImportFromShareableHandle's osHandle: converted like a devPtr (so rejected the same
    way), but passed on as given, since a FABRIC handle is the 64 bytes themselves."""
    dev_ptr(obj)
    return obj


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


def converter(sig: tuple[Conv, ...]) -> Callable[[tuple], tuple]:
    """One function applying `sig`'s converters to a call's arguments (their count checked
    already). Written out per arity: a call per argument from Python code costs about half of
    one made from map() or a comprehension, and every simulated driver call converts (a few
    hundred per generated scenario)."""
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
    return tuple([conv(a) for conv, a in zip(sig, args)])
