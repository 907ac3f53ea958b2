"""CUDA-graph buffer registration over legacy IPC, as vLLM's custom all-reduce does it
(rule AL3 of docs/lifecycle-rules.md).

A captured op's input lives somewhere inside a caching-allocator block, not at an allocation
base. `cudaIpcGetMemHandle` takes only bases, so each rank sends, per recorded pointer, the
handle of its allocation's base (found with `cuPointerGetAttribute(RANGE_START_ADDR)`) and
the offset into it. Peers open each distinct handle once (the driver would refcount a second
open anyway, row L6) and add the offsets.

Over expandable segments (cuMem memory) the base has no legacy handle: the export answers
`cudaErrorInvalidValue` (row L2, vLLM#42609), which is the failure at `register`.
"""

from __future__ import annotations

from typing import Any, Sequence

from commsim.driver import LAZY_ENABLE_PEER_ACCESS, CudaError, Driver, check

# CU_POINTER_ATTRIBUTE_RANGE_START_ADDR (cuda.h).
RANGE_START_ADDR = 11


def range_start(driver: Driver, ptr: int) -> int:
    """The base of the allocation holding `ptr`: `cuPointerGetAttribute(RANGE_START_ADDR)`."""
    return int(check("cuPointerGetAttribute", driver.cuPointerGetAttribute(_attr(RANGE_START_ADDR), ptr)))


# CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE (cuda.h).
IS_LEGACY_CUDA_IPC_CAPABLE = 10


def legacy_ipc_capable(driver: Driver, ptr: int) -> bool:
    """`cuPointerGetAttribute(IS_LEGACY_CUDA_IPC_CAPABLE)`: 1 only for `cudaMalloc` memory
    (vllm-project/vllm#51903 proposes checking it before registering)."""
    return bool(check("cuPointerGetAttribute",
                      driver.cuPointerGetAttribute(_attr(IS_LEGACY_CUDA_IPC_CAPABLE), ptr)))


def _attr(value: int) -> Any:
    from cuda.bindings import driver as cu
    return cu.CUpointer_attribute(value)


def export_buffers(driver: Driver, ptrs: Sequence[int]) -> list[tuple[bytes, int]]:
    """Per recorded pointer: (IPC handle of its allocation base, offset into it)."""
    out = []
    for p in ptrs:
        base = range_start(driver, p)
        out.append((check("cudaIpcGetMemHandle", driver.cudaIpcGetMemHandle(base)), p - base))
    return out


def _handle_key(handle: Any) -> bytes:
    """A handle's bytes (the simulator's are bytes; cuda-python's cudaIpcMemHandle_t exposes
    the buffer protocol)."""
    return bytes(handle) if isinstance(handle, (bytes, bytearray)) else bytes(memoryview(handle))


class OpenedBases:
    """The peer bases one rank has opened, keyed by handle bytes.

    With `cache` (vLLM's map of opened handles, the default) each base is opened once. Without
    it (a stack that opens every buffer's handle) a handle shared by several buffers is opened
    again per buffer: a current driver returns the same pointer and counts a reference (rows
    L6/H1), an older one answers cudaErrorAlreadyMapped (row H2). Every successful open is
    kept in `mappings`, so each is closed once."""

    def __init__(self, driver: Driver, cache: bool = True):
        self.driver = driver
        self.cache = cache
        self.by_handle: dict[bytes, int] = {}
        self.mappings: list[int] = []

    def pointer(self, handle: Any, offset: int) -> int:
        key = _handle_key(handle)
        base = self.by_handle.get(key) if self.cache else None
        if base is None:
            base = check("cudaIpcOpenMemHandle", self.driver.cudaIpcOpenMemHandle(handle, LAZY_ENABLE_PEER_ACCESS))
            self.by_handle[key] = base
            self.mappings.append(base)
        return base + offset

    def close(self) -> list[CudaError]:
        """Close every mapping opened; errors are returned, not raised, so teardown finishes."""
        errs = []
        for base in self.mappings:
            try:
                check("cudaIpcCloseMemHandle", self.driver.cudaIpcCloseMemHandle(base))
            except CudaError as e:
                errs.append(e)
        self.by_handle.clear()
        self.mappings.clear()
        return errs


def open_peer_buffers(opened: OpenedBases, metas: Sequence[Sequence[tuple[bytes, int]]],
                      me: int) -> list[list[int]]:
    """metas[r] = rank r's exported (handle, offset) list. Returns ptrs[r][i]: rank r's i-th
    buffer in this process; the own rank's entries are left empty for the caller to fill."""
    return [[] if r == me else [opened.pointer(h, off) for h, off in m] for r, m in enumerate(metas)]
