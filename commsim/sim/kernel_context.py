"""The simulator's KernelContext: a kernel's loads and stores go through the launching
process's mappings in simulated device memory (`SimDriver.view`), so an unmapped, access-less
or freed range faults exactly like a CUDA kernel would (cudaErrorIllegalAddress).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..kernels.context import KernelContext


class SimKernelContext(KernelContext):
    def __init__(self, driver: Any):
        self.driver = driver        # the SimDriver of the launching process

    def array(self, ptr: int, dtype: np.dtype, count: int) -> np.ndarray:
        dt = np.dtype(dtype)
        return self.driver.view(ptr, dt.itemsize * count).view(dt)

    def multimem(self, ptr: int, dtype: np.dtype, count: int) -> list[np.ndarray]:
        dt = np.dtype(dtype)
        return [v.view(dt) for v in self.driver.multimem_views(ptr, dt.itemsize * count)]
