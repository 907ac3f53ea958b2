"""CUDA-graph buffer registration over legacy IPC, as vLLM's custom all-reduce does it
(reference §7.1; rule AL3 of docs/lifecycle-rules.md).

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

from .driver import LAZY_ENABLE_PEER_ACCESS, CudaError, Driver, check

# CU_POINTER_ATTRIBUTE_RANGE_START_ADDR (cuda.h; reference §1.3).
RANGE_START_ADDR = 11


def range_start(driver: Driver, ptr: int) -> int:
    """The base of the allocation holding `ptr`: `cuPointerGetAttribute(RANGE_START_ADDR)`."""
    return int(check("cuPointerGetAttribute", driver.cuPointerGetAttribute(_attr(RANGE_START_ADDR), ptr)))


# CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE (cuda.h; reference §1.3).
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


class OpenedBases:
    """The peer bases one rank has opened, keyed by handle bytes: each base opened once."""

    def __init__(self, driver: Driver):
        self.driver = driver
        self.by_handle: dict[bytes, int] = {}

    def pointer(self, handle: Any, offset: int) -> int:
        key = bytes(handle)
        base = self.by_handle.get(key)
        if base is None:
            base = check("cudaIpcOpenMemHandle", self.driver.cudaIpcOpenMemHandle(handle, LAZY_ENABLE_PEER_ACCESS))
            self.by_handle[key] = base
        return base + offset

    def close(self) -> list[CudaError]:
        """Close every opened base; errors are returned, not raised, so teardown finishes."""
        errs = []
        for base in self.by_handle.values():
            try:
                check("cudaIpcCloseMemHandle", self.driver.cudaIpcCloseMemHandle(base))
            except CudaError as e:
                errs.append(e)
        self.by_handle.clear()
        return errs


def open_peer_buffers(opened: OpenedBases, metas: Sequence[Sequence[tuple[bytes, int]]],
                      me: int) -> list[list[int]]:
    """metas[r] = rank r's exported (handle, offset) list. Returns ptrs[r][i]: rank r's i-th
    buffer in this process; the own rank's entries are left empty for the caller to fill."""
    return [[] if r == me else [opened.pointer(h, off) for h, off in m] for r, m in enumerate(metas)]
