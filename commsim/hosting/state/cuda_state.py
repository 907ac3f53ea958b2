"""Per-rank CUDA state and argument conversion shared by the hosted CUDA surfaces.

The cuda-python modules (surfaces/cuda/runtime_api, driver_api) and the ctypes libcudart
(cudart.py) are two faces of one process's CUDA: they share the rank's driver and this
state (driver initialised, current context, primary-context references, streams, the
runtime's sticky last error), so a program mixing them sees one consistent process.

Argument conversion follows cuda-python 13.x (cuda.bindings): handle-typed parameters go
through the binding's own handle classes (`CUdeviceptr(x)` etc.), so a wrong type raises
exactly what the real binding raises; C integer parameters are range-checked with the
messages Cython gives (checked against the installed cuda-bindings 13.4).
"""

from __future__ import annotations

import ctypes
import functools
import inspect
import weakref
from dataclasses import dataclass, field
from typing import Any, Callable

from cuda.bindings import driver as cu
from cuda.bindings import runtime as cudart

from commsim.driver import error_name, error_string
from commsim.sim import binding_args
from commsim.hosting.state.driver_view import refusal_of
from commsim.hosting.state.session import HostedRank, current, hosted

E = cudart.cudaError_t
R = cu.CUresult

# Context handles are opaque pointers; these values only have to be distinct per device of
# one process and never 0 (NULL = no context).
_CTX_BASE = 0x5C0_0000_0000
_STREAM_BASE = 0x5D0_0000_0000


@dataclass
class RankCuda:
    """What CUDA keeps per process besides memory (the SimDriver keeps memory)."""

    initialized: bool = False            # cuInit done (the runtime does it implicitly)
    ctx_bound: bool = False              # a context is current on the calling thread
    primary_refs: dict[int, int] = field(default_factory=dict)   # ordinal -> retains
    streams: dict[int, int] = field(default_factory=dict)        # handle -> ordinal
    next_stream: int = 1
    last_error: int = 0                  # cudaGetLastError's sticky code


_states: "weakref.WeakKeyDictionary[Any, RankCuda]" = weakref.WeakKeyDictionary()


def rank_state(r: Any, key: str, make: Callable[[], Any]) -> Any:
    """Per-rank surface state: in the rank's `state` dict (the hosting core's HostedRank keeps
    one; in inproc mode all ranks share one interpreter, so never a module global), else
    keyed by the rank's driver."""
    store = getattr(r, "state", None)
    if isinstance(store, dict):
        if key not in store:
            store[key] = make()
        return store[key]
    per = _by_driver.setdefault(key, weakref.WeakKeyDictionary())
    if r.driver not in per:
        per[r.driver] = make()
    return per[r.driver]


_by_driver: dict[str, "weakref.WeakKeyDictionary[Any, Any]"] = {}


def state(driver: Any) -> RankCuda:
    """The CUDA state of the rank that owns `driver` (the running rank)."""
    r = hosted()
    if r is not None and r.driver is driver:
        return rank_state(r, "cuda", RankCuda)
    st = _states.get(driver)
    if st is None:
        st = _states[driver] = RankCuda()
    return st


def reset_context(driver: Any, ordinal: int) -> None:
    """What a device reset destroys besides memory (the SimDriver frees that): the streams
    created on `ordinal` and the peer access it enabled (cudaDeviceReset, CUDA Runtime API,
    cuda_runtime_api.h, CUDA 13.0: "all resources associated with the current device in the
    current process", streams named). The primary context's retain count stays
    (cuDevicePrimaryCtxReset, cuda.h: "resetting the primary context does not release it")."""
    st = state(driver)
    st.streams = {h: o for h, o in st.streams.items() if o != ordinal}
    peers = st.__dict__.get("peers")
    if peers:
        st.__dict__["peers"] = {p for p in peers if p[0] != ordinal}


def ctx_handle(driver: Any, ordinal: int) -> int:
    return _CTX_BASE + (driver.getpid() % 4096) * 0x10000 + ordinal * 0x100 + 0x10


def ctx_ordinal(driver: Any, handle: int) -> int | None:
    off = handle - ctx_handle(driver, 0)
    if off < 0 or off % 0x100:
        return None
    o = off // 0x100
    n = int(driver.cudaGetDeviceCount()[1])
    return o if o < n else None


def new_stream(driver: Any, st: RankCuda, ordinal: int) -> int:
    h = _STREAM_BASE + (driver.getpid() % 4096) * 0x100000 + st.next_stream * 0x40
    st.next_stream += 1
    st.streams[h] = ordinal
    return h


def runtime_entry(r: HostedRank, context: bool = True) -> RankCuda:
    """The runtime initialises the driver on its first call, and creates the current
    device's primary context and makes it current on the first call that needs an active
    context (CUDA C Programming Guide, "Initialization"; since CUDA 12.0 cudaSetDevice
    initialises the primary context at once, Runtime API docs). Device queries
    (count, properties, attributes, peer capability, versions) need none."""
    st = state(r.driver)
    st.initialized = True
    if context:
        st.ctx_bound = True
    return st


def report(r: HostedRank, api: str, err: Any, runtime: bool) -> None:
    """Tell the rank's events about a failing call (the first one is the verdict's)."""
    code = int(err)
    if code == 0:
        return
    if runtime:
        state(r.driver).last_error = code
    r.events.cuda_error(api, code, error_name(err), error_string(code),
                        why=refusal_of(r.driver))


def as_cu(err: Any) -> Any:
    """A runtime code as the driver's CUresult of the same number (cuda-python 13's
    cudaError_t and CUresult share numbers for every code the simulator gives)."""
    try:
        return R(int(err))
    except ValueError:
        return R.CUDA_ERROR_UNKNOWN


def as_rt(err: Any) -> Any:
    try:
        return E(int(err))
    except ValueError:
        return E.cudaErrorUnknown


# ---- the call wrapper both cuda-python modules use -----------------------------------------

class ApiFail(Exception):
    """Raised inside an API body to fail the call with `code` (never escapes the wrapper)."""

    def __init__(self, code: Any):
        self.code = code


def api_call(nvals: int, runtime: bool, before: Callable[[HostedRank, str], None]
             ) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Wrap an API body for the current rank: `before(rank, name)` (entry rules, may raise
    ApiFail), the body returning (code, value...) or raising ApiFail, the code as the
    module's enum, a failure reported to the rank's events, `nvals` Nones on failure."""
    as_enum = as_rt if runtime else as_cu

    def deco(fn: Callable[..., Any]) -> Callable[..., Any]:
        convert = binding_call(fn)

        @functools.wraps(fn)
        def call(*args: Any, **kwargs: Any) -> tuple:
            # The binding converts every argument before anything reaches CUDA, so what it
            # cannot convert raises here, before the entry rules (cuInit first...) answer.
            args = convert(args, kwargs)
            r = current()
            seen = getattr(r.events, "cuda_errors", None)
            try:
                before(r, fn.__name__)
                out = fn(*args)
            except ApiFail as e:
                out = (e.code,) + (None,) * nvals
            if not isinstance(out, tuple):
                out = (out,)
            err = as_enum(out[0])
            if seen is None or getattr(r.events, "cuda_errors", None) == seen:
                # not yet reported by the hosting core's watched driver: report it here
                report(r, fn.__name__, err, runtime=runtime)
            elif runtime:
                state(r.driver).last_error = int(err) or state(r.driver).last_error
            return (err,) + tuple(out[1:])
        return call
    return deco


# ---- argument conversion as cuda-python does it -------------------------------------------

def binding_call(fn: Callable[..., Any]) -> Callable[[tuple, dict], tuple]:
    """(args, kwargs) -> the positional arguments of `fn` as the real binding of the same name
    converts them (commsim.sim.binding_args.BINDINGS), raising what it raises. Keyword calls
    bind by the binding's parameter names, which the stand-ins share."""
    names = list(inspect.signature(fn).parameters)
    if not all(n.isidentifier() for n in names):
        raise AssertionError(f"{fn.__name__}: parameters {names}")
    convs = binding_args.BINDINGS.get(fn.__name__)
    if convs is not None and len(convs) != len(names):
        raise AssertionError(f"{fn.__name__}: {len(names)} parameters, {len(convs)} converters")
    # A function of the same name and parameters binds a call, so a wrong keyword or count
    # gets Python's own TypeError naming the function, as the binding's does.
    ns: dict[str, Any] = {}
    exec(f"def {fn.__name__}({', '.join(names)}):\n    return ({''.join(n + ', ' for n in names)})", ns)
    binder = ns[fn.__name__]

    order = None if convs is None else sorted(range(len(convs)),
                                              key=lambda i: getattr(convs[i], "late", False))

    def convert(args: tuple, kwargs: dict) -> tuple:
        if kwargs or len(args) != len(names):
            args = binder(*args, **kwargs)
        if convs is None:
            return args
        out = list(args)
        for i in order:
            out[i] = convs[i](args[i])
        return binding_args.check_list_count(fn.__name__, tuple(out))
    return convert


def handle_value(cls: type, x: Any) -> int:
    """A handle parameter: None is NULL, an instance of `cls` its value, anything else goes
    through `cls(x)` (which raises TypeError for a wrong type, as the binding does)."""
    if x is None:
        return 0
    if isinstance(x, cls):
        return int(x)
    return int(cls(x))


def devptr(x: Any) -> int:
    return handle_value(cu.CUdeviceptr, x)


def void_ptr(x: Any) -> int:
    """A `void*` parameter of the runtime (cuda-python's _HelperInputVoidPtr): None, an int
    address, a handle object, or any buffer (its address)."""
    if x is None:
        return 0
    if isinstance(x, int):
        return x
    if hasattr(x, "getPtr") and hasattr(x, "__int__"):
        return int(x)
    return host_buffer(x)[0]


def host_buffer(x: Any) -> tuple[int, int]:
    """(address, length) of a host buffer argument; anything else is refused with the
    binding's message (cuda-python _HelperInputVoidPtr)."""
    try:
        return buffer_address(x)
    except TypeError:
        raise TypeError(f"Provided argument is of type {type(x)} but expected Type "
                        f"{type(None)}, {type} or object with Buffer Protocol") from None


def buffer_address(x: Any) -> tuple[int, int]:
    """(address, byte length) of a buffer-protocol object (writable or not)."""
    mv = memoryview(x)
    n = mv.nbytes
    if not mv.readonly:
        return ctypes.addressof((ctypes.c_char * max(n, 1)).from_buffer(mv.cast("B"))), n
    if isinstance(x, bytes):
        return ctypes.cast(ctypes.c_char_p(x), ctypes.c_void_p).value or 0, n
    # A read-only non-bytes buffer: the binding would hand the driver its pointer; copying
    # would lose writes, so refuse rather than guess.
    raise TypeError(f"commsim hosting: read-only buffer of type {type(x).__name__} cannot be "
                    f"addressed; pass bytes, a writable buffer or an int address")


def converted(fn: Callable[..., Any]) -> Callable[..., Any]:
    """A binding function that needs no rank (error texts): its arguments converted as the
    binding converts them, then the body."""
    convert = binding_call(fn)

    @functools.wraps(fn)
    def call(*args: Any, **kwargs: Any) -> Any:
        return fn(*convert(args, kwargs))
    return call


_C_INTS = {"size_t": binding_args.size_t, "unsigned long long": binding_args.size_t,
           "unsigned char": binding_args.c_uchar, "unsigned short": binding_args.c_ushort,
           "unsigned int": binding_args.c_uint, "int": binding_args.c_int}


def c_int(x: Any, ctype: str = "int") -> int:
    """A C integer parameter, converted the way Cython converts it (binding_args)."""
    if not isinstance(x, int) and not hasattr(type(x), "__int__") \
            and isinstance(getattr(x, "value", None), int):
        x = x.value          # an enum member where a plain int is expected
    return _C_INTS[ctype](x)


def enum_value(x: Any) -> int:
    """An enum parameter cuda-python converts with `int(x)` (an int is accepted)."""
    return int(x)


def enum_attr_value(x: Any) -> int:
    """An enum parameter cuda-python reads through `.value` (its _Helper classes): a plain
    int raises AttributeError there, and so here."""
    return int(x.value)


def check_struct(x: Any, cls: type, pname: str, allow_none: bool = True) -> None:
    if x is None and allow_none:
        return
    if not isinstance(x, cls):
        raise TypeError(f"Argument '{pname}' has incorrect type (expected "
                        f"{cls.__module__}.{cls.__name__}, got {type(x).__name__})")
