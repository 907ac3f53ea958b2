"""What a collective kernel may touch: device memory through the launching process's mappings
and 32-bit signal flags.

A kernel gets a `KernelContext` bound to the process that launched it. The simulator supplies
one over its simulated memory (`commsim.sim.kernel_context.SimKernelContext`); on a GPU the
same routines are CUDA C (device/kernels/*.cu) and never see a context. The flag protocol is
the one the .cu kernels use: a release-store of the round number, an acquire-spin until a flag
reaches it. Spinning goes through the runtime (`wait_until`), which switches to the other
ranks the way a GPU spin lets other blocks run.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Callable, Sequence

import numpy as np

from commsim.runtime.scheduler import wait_until

FLAG_DTYPE = np.uint32


class KernelContext(ABC):
    @abstractmethod
    def array(self, ptr: int, dtype: np.dtype, count: int) -> np.ndarray:
        """A typed, writable view of `count` elements at device address `ptr`; an unmapped,
        access-less or freed range faults (cudaErrorIllegalAddress) as a CUDA kernel would."""

    @abstractmethod
    def multimem(self, ptr: int, dtype: np.dtype, count: int) -> list[np.ndarray]:
        """multimem.ld_reduce / st operands: one view per device bound to the multicast range."""

    def load(self, ptr: int, dtype: np.dtype, count: int) -> np.ndarray:
        """Like `array`, for reading only (the result may be read-only): a simulator may read
        bytes shared between buffers through one mapping of them."""
        return self.array(ptr, dtype, count)

    def multimem_load(self, ptr: int, dtype: np.dtype, count: int) -> list[np.ndarray]:
        """Like `multimem`, for reading only (multimem.ld_reduce operands)."""
        return self.multimem(ptr, dtype, count)

    def multimem_store(self, ptr: int, data: np.ndarray) -> None:
        """multimem.st of the bytes `data` (1-D uint8) at multicast address `ptr`: the same
        bytes land in every member's memory. A simulator may share them between members."""
        for v in self.multimem(ptr, np.uint8, data.nbytes):
            np.copyto(v, data)

    def signal_all(self, ptrs: Sequence[int], offset: int, value: int) -> None:
        """signal(p + offset, value) for every p, in order (a barrier's stores to its peers)."""
        for p in ptrs:
            self.signal(p + offset, value)

    def wait_all(self, flags: np.ndarray, value: int, what: Callable[[int], str]) -> None:
        """Acquire-spin until every flag of `flags` (a view of consecutive 32-bit flags) is
        >= value: a vectorised scan, and a wait only on the first flag still behind (named
        by `what(j)` in a hang diagnosis), rescanning after each. A wait per flag was O(ranks)
        scheduler calls per rank per barrier, O(ranks^2) per round."""
        while True:
            behind = np.flatnonzero(flags < value)
            if behind.size == 0:
                return
            j = int(behind[0])
            wait_until(lambda: int(flags[j]) >= value, what(j))

    def signal(self, ptr: int, value: int) -> None:
        """Release-store of a 32-bit flag (st.release.sys on the GPU)."""
        self.array(ptr, FLAG_DTYPE, 1)[0] = value

    def wait(self, ptr: int, value: int, what: str) -> None:
        """Acquire-spin until the 32-bit flag at `ptr` is >= value (ld.acquire.sys loop)."""
        flag = self.array(ptr, FLAG_DTYPE, 1)
        wait_until(lambda: int(flag[0]) >= value, what)
