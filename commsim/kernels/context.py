"""What a collective kernel may touch: device memory through the launching process's mappings
and 32-bit signal flags (DESIGN.md §5).

A kernel gets a `KernelContext` bound to the process that launched it. The simulator supplies
one over its simulated memory (`commsim.sim.kernel_context.SimKernelContext`); on a GPU the
same routines are CUDA C (device/kernels/*.cu) and never see a context. The flag protocol is
the one the .cu kernels use: a release-store of the round number, an acquire-spin until a flag
reaches it. Spinning goes through the runtime (`wait_until`), which switches to the other
ranks the way a GPU spin lets other blocks run.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

import numpy as np

from ..runtime.scheduler import wait_until

FLAG_DTYPE = np.uint32


class KernelContext(ABC):
    @abstractmethod
    def array(self, ptr: int, dtype: np.dtype, count: int) -> np.ndarray:
        """A typed, writable view of `count` elements at device address `ptr`; an unmapped,
        access-less or freed range faults (cudaErrorIllegalAddress) as a CUDA kernel would."""

    @abstractmethod
    def multimem(self, ptr: int, dtype: np.dtype, count: int) -> list[np.ndarray]:
        """multimem.ld_reduce / st operands: one view per device bound to the multicast range."""

    def signal(self, ptr: int, value: int) -> None:
        """Release-store of a 32-bit flag (st.release.sys on the GPU)."""
        self.array(ptr, FLAG_DTYPE, 1)[0] = value

    def wait(self, ptr: int, value: int, what: str) -> None:
        """Acquire-spin until the 32-bit flag at `ptr` is >= value (ld.acquire.sys loop)."""
        flag = self.array(ptr, FLAG_DTYPE, 1)
        wait_until(lambda: int(flag[0]) >= value, what)
