"""What every simulated driver call shares: the @api wrapper (argument conversion as
cuda-python does it, a dead process, a sticky error, injected faults, capture refusals, then
the body; a Fail becomes `(code, None...)`), a process's address-space mapping, and readers of
struct fields and handle blobs. The calls themselves live in driver.py (identity, address
space, memory, capture, NVML, kernels) and its mixins driver_ipc.py, driver_vmm.py and
driver_multicast.py, grouped by the rules they follow (legacy IPC, VMM, multicast).
"""

from __future__ import annotations

import ctypes
import functools
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

from cuda.bindings import driver as cu
from cuda.bindings import runtime as cudart

from commsim.sim import binding_args, stream_capture
from commsim.sim.fabric import MulticastObject, PhysicalAlloc

if TYPE_CHECKING:
    from commsim.sim.driver import SimDriver

E = cudart.cudaError_t
R = cu.CUresult
A = cu.CUdevice_attribute
VA_ALIGN = 512          # cudaMalloc alignment seen in practice is >= 256 B


class Fail(Exception):
    """Internal: abort the current call with this code (caught by @api, never escapes).
    `rule` and `peer`: which rule refused and the GPU whose memory the call named, kept on
    the driver as its `refusal` so a verdict can say why in the machine's terms."""

    def __init__(self, code: Any, rule: str | None = None, peer: Any = None):
        self.code = code
        self.rule = rule
        self.peer = peer


@dataclass(frozen=True)
class Refusal:
    """Why the driver's last failing call failed: the API, the rule row, the peer GPU."""
    api: str
    rule: str | None
    peer: str | None           # "host/gpuN" of the memory the call named, when it named one


def api(nvals: int, runtime: bool):
    """Wrap a driver method: faults first, then the body; a Fail becomes `(code, None...)`."""
    ok = E.cudaSuccess if runtime else R.CUDA_SUCCESS
    nones = (None,) * nvals
    dead = (E.cudaErrorCudartUnloading if runtime else R.CUDA_ERROR_DEINITIALIZED,) + nones

    def deco(fn: Callable) -> Callable:
        name = fn.__name__
        # Looked up once per method, not per call (a few hundred calls per generated scenario):
        # its parameters' converters, and whether a capture can refuse it at all (CG1-CG3).
        sig = binding_args.SIGNATURES.get(name)
        conv = binding_args.converter(sig, name) if sig else None
        may_refuse = name in stream_capture.UNSAFE

        @functools.wraps(fn)
        def wrapper(self: "SimDriver", *args: Any) -> tuple:
            # What cuda-python's wrapper rejects while converting arguments, rejected the same
            # way (an exception, before anything else); what converts gets a code below.
            if sig is not None:
                if len(args) != len(sig):
                    binding_args.convert(name, args)        # raises the TypeError
                if conv is not None:
                    args = conv(args)
            proc = self.proc
            if not proc.alive:
                return dead
            if proc.sticky is not None:
                # A sticky error (row MC6) answers every later call of the context with itself.
                return (proc.sticky if runtime else R.CUDA_ERROR_ILLEGAL_ADDRESS,) + nones
            # Every call counts towards its fault index (ProcessFaults.before, inlined: a few
            # hundred calls per generated scenario, nearly all with no fault armed).
            faults = proc.faults
            counts = faults.counts
            n = counts[name] = counts.get(name, 0) + 1
            if faults.calls or faults.oom_at is not None:
                forced = faults.forced(name, n)
                if forced is not None:
                    return (forced,) + nones
            if may_refuse:
                # Rules CG1-CG3 (stream_capture.py): a call the runtime refuses during a capture.
                refused = self.capture.refused(name)
                if refused is not None:
                    return (refused,) + nones
            if self.refusal is not None:
                self.refusal = None
            try:
                out = fn(self, *args)
            except Fail as f:
                if f.rule is not None or f.peer is not None:
                    self.refusal = Refusal(name, f.rule, None if f.peer is None else str(f.peer))
                return (f.code,) + nones
            if nvals == 0:
                return (ok,)
            return (ok, out) if nvals == 1 else (ok,) + tuple(out)
        return wrapper
    return deco


@dataclass(eq=False)
class Mapping:
    base: int
    size: int
    kind: str                       # "malloc" | "ipc" | "vmm" | "mc"
    target: PhysicalAlloc | MulticastObject
    offset: int = 0
    access: bool = True
    refs: int = 1
    handle: int | None = None       # process-local VMM handle it was mapped from
    device: Any = None              # the GpuRef whose context opened an "ipc" mapping


def _attr_int(x: Any) -> int:
    """An int read from a struct field or a parameter the binding passes through as it is
    (binding_args.passthrough); -1 (which every rule refuses) for anything that is no finite
    number. A parameter with a converter reaches the body as the converted int already."""
    try:
        return int(x)
    except (TypeError, ValueError, OverflowError):
        return -1


def _prop_handle_types(prop: Any) -> int:
    """`prop.requestedHandleTypes` as an int. cuda-python's setter takes any mask, but its
    getter raises ValueError for one that is no single enum member (FD|FABRIC, the "ANY" mode
    projects request); then the raw field is read (CUmemAllocationProp: type, requestedHandleTypes,
    both 32-bit, per cuda.h)."""
    try:
        return _attr_int(getattr(prop, "requestedHandleTypes", 0))
    except ValueError:
        try:
            return int(ctypes.c_uint32.from_address(prop.getPtr() + 4).value)
        except Exception:
            return -1


def _handle_bytes(x: Any, attr: str) -> bytes | None:
    """The first 64 bytes of a handle blob (bytes-like, a cuda-python handle with `attr`, or
    a ctypes struct), or None when `x` is no blob. Numbers are refused: `bytes(n)` would
    build n zero bytes (a garbage pointer passed as a handle must give an error code)."""
    x = getattr(x, attr, x)
    if x is None or isinstance(x, (int, float, complex, str)):
        return None
    try:
        return bytes(memoryview(x))[:64]
    except (TypeError, ValueError, BufferError):
        return None
