"""The simulator's KernelContext: a kernel's loads and stores go through the launching
process's mappings in simulated device memory (`SimDriver.view`), so an unmapped, access-less
or freed range faults exactly like a CUDA kernel would (cudaErrorIllegalAddress).
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from commsim.kernels.context import KernelContext


class SimKernelContext(KernelContext):
    def __init__(self, driver: Any):
        self.driver = driver        # the SimDriver of the launching process

    def array(self, ptr: int, dtype: np.dtype, count: int) -> np.ndarray:
        dt = np.dtype(dtype)
        return self.driver.view(ptr, dt.itemsize * count).view(dt)

    def multimem(self, ptr: int, dtype: np.dtype, count: int) -> list[np.ndarray]:
        dt = np.dtype(dtype)
        return [v.view(dt) for v in self.driver.multimem_views(ptr, dt.itemsize * count)]

    def load(self, ptr: int, dtype: np.dtype, count: int) -> np.ndarray:
        dt = np.dtype(dtype)
        v = self.driver.view(ptr, dt.itemsize * count)
        shared = self.driver.fabric.memory.canonical(v)
        return (v if shared is None else shared).view(dt)

    def multimem_load(self, ptr: int, dtype: np.dtype, count: int) -> list[np.ndarray]:
        dt = np.dtype(dtype)
        canonical = self.driver.fabric.memory.canonical
        out = []
        for v in self.driver.multimem_views(ptr, dt.itemsize * count):
            shared = canonical(v)
            out.append((v if shared is None else shared).view(dt))
        return out

    def multimem_store(self, ptr: int, data: np.ndarray) -> None:
        # One sealed copy behind every member's pages (commsim/sim/shared_pages.py).
        self.driver.fabric.memory.broadcast(self.driver.multimem_views(ptr, data.nbytes), data)

    def signal_all(self, ptrs: Sequence[int], offset: int, value: int) -> None:
        # One encoded word and the driver's view per peer: the hot path of every barrier.
        word = np.array([value], np.uint32).view(np.uint8)
        view = self.driver.view
        for p in ptrs:
            view(p + offset, 4)[:] = word
