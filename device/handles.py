"""cuda-python handle structs <-> the project's plain values (commsim/driver.py conventions).

Legacy IPC and fabric handles cross the Driver as 64-byte `bytes`, VMM and multicast handles
as `int`, POSIX fds as `int`: values that pickle, so they travel over any group. cuda-python
13 exposes `cudaIpcMemHandle_t` without fields, so its 64 bytes are read and written through
its address (`getPtr`); `CUmemFabricHandle.data` is a bytes field.

The struct arguments the callers build (`alloc_prop`, `access_desc`, `multicast_prop`) do
not pickle; `describe` / `rebuild` turn them into tuples and back, for the conformance rig
that runs each Driver in its own process.
"""

from __future__ import annotations

import ctypes
from typing import Any

from cuda.bindings import driver as cu
from cuda.bindings import runtime as cudart

from commsim.driver import FABRIC_HANDLE_SIZE, IPC_HANDLE_SIZE, access_desc, alloc_prop, multicast_prop


def blob(x: Any, size: int = 64) -> bytes | None:
    """The first `size` bytes of a handle given as bytes-like or a struct with getPtr /
    data; None for anything else (a number is not a handle: `bytes(n)` would invent one)."""
    if x is None or isinstance(x, (bool, int, float, complex, str)):
        return None
    data = getattr(x, "data", None)
    if isinstance(data, (bytes, bytearray)):
        return bytes(data)[:size]
    if callable(getattr(x, "getPtr", None)):
        return ctypes.string_at(int(x.getPtr()), size)
    try:
        b = bytes(memoryview(x))
    except (TypeError, ValueError, BufferError):
        return None
    return b[:size] if len(b) >= size else None


def ipc_handle(data: bytes) -> "cudart.cudaIpcMemHandle_t":
    h = cudart.cudaIpcMemHandle_t()
    ctypes.memmove(int(h.getPtr()), bytes(data)[:IPC_HANDLE_SIZE].ljust(IPC_HANDLE_SIZE, b"\0"),
                   IPC_HANDLE_SIZE)
    return h


def ipc_bytes(h: "cudart.cudaIpcMemHandle_t") -> bytes:
    return ctypes.string_at(int(h.getPtr()), IPC_HANDLE_SIZE)


def fabric_handle(data: bytes) -> "cu.CUmemFabricHandle":
    h = cu.CUmemFabricHandle()
    h.data = bytes(data)[:FABRIC_HANDLE_SIZE].ljust(FABRIC_HANDLE_SIZE, b"\0")
    return h


def fabric_bytes(h: Any) -> bytes:
    return bytes(h.data)[:FABRIC_HANDLE_SIZE]


def as_int(h: Any) -> int:
    """A CUmemGenericAllocationHandle / CUdeviceptr / plain int as int."""
    return int(h)


# ---- picklable descriptions of the struct arguments ---------------------------------------

def _raw_u32(struct: Any, offset: int) -> int:
    return int(ctypes.c_uint32.from_address(int(struct.getPtr()) + offset).value)


def describe(x: Any) -> Any:
    """A tuple standing for a prop/desc struct (or a list of them); other values unchanged."""
    if isinstance(x, cu.CUmemAllocationProp):
        # requestedHandleTypes' getter rejects masks that are no single enum member (FD|FABRIC);
        # the raw field is at offset 4 (type, requestedHandleTypes: both 32-bit, cuda.h).
        return ("alloc_prop", int(x.location.id), _raw_u32(x, 4))
    if isinstance(x, cu.CUmemAccessDesc):
        return ("access_desc", int(x.location.id))
    if isinstance(x, cu.CUmulticastObjectProp):
        return ("multicast_prop", int(x.numDevices), int(x.size), _raw_handle_types(x))
    if isinstance(x, list):
        return [describe(v) for v in x]
    return x


def _raw_handle_types(p: Any) -> int:
    try:
        return int(p.handleTypes)
    except ValueError:
        return -1


def rebuild(x: Any) -> Any:
    """The struct a `describe` tuple stands for."""
    if isinstance(x, tuple) and x and x[0] == "alloc_prop":
        return alloc_prop(x[1], x[2])
    if isinstance(x, tuple) and x and x[0] == "access_desc":
        return access_desc(x[1])
    if isinstance(x, tuple) and x and x[0] == "multicast_prop":
        return multicast_prop(x[1], x[2], max(x[3], 0))
    if isinstance(x, list):
        return [rebuild(v) for v in x]
    return x
