"""Simulated kernels: Python routines that run "on" a simulated GPU through mapped pointers.

A kernel receives a KernelContext bound to the launching process: it reads and writes device
memory only through that process's mappings (so an unmapped, access-less or freed range
faults exactly like a CUDA kernel would: cudaErrorIllegalAddress), and synchronises with the
kernels of other ranks through signal flags in device memory, spinning via the scheduler
(`wait_until`) the way a CUDA kernel spins on a volatile flag. The device layer's .cu kernels
use the same flag protocol (DESIGN.md §5).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable

import numpy as np

from ..group.scheduler import wait_until

if TYPE_CHECKING:
    from .driver import SimDriver

FLAG_DTYPE = np.uint32


class KernelContext:
    def __init__(self, driver: "SimDriver"):
        self.driver = driver

    def array(self, ptr: int, dtype: np.dtype, count: int) -> np.ndarray:
        """A typed, writable view of `count` elements at device address `ptr`."""
        dt = np.dtype(dtype)
        return self.driver.view(ptr, dt.itemsize * count).view(dt)

    def multimem(self, ptr: int, dtype: np.dtype, count: int) -> list[np.ndarray]:
        """multimem.ld_reduce / st operands: one view per device bound to the multicast range."""
        dt = np.dtype(dtype)
        return [v.view(dt) for v in self.driver.multimem_views(ptr, dt.itemsize * count)]

    def signal_all(self, ptrs: "list[int] | tuple[int, ...]", offset: int, value: int) -> None:
        """signal(p + offset, value) for every p, in order (a barrier's stores to its peers)."""
        word = np.array([value], FLAG_DTYPE).view(np.uint8)
        view = self.driver.view
        for p in ptrs:
            view(p + offset, 4)[:] = word

    def signal(self, ptr: int, value: int) -> None:
        """Release-store of a 32-bit flag (st.release.sys on the GPU)."""
        self.array(ptr, FLAG_DTYPE, 1)[0] = value

    def wait_all(self, flags: np.ndarray, value: int, what: Callable[[int], str]) -> None:
        """Acquire-spin until every flag of `flags` (a view of consecutive 32-bit flags) is
        >= value: a vectorised scan, and a wait only on the first flag still behind (named
        by `what(j)` in a hang diagnosis), rescanning after each."""
        while True:
            behind = np.flatnonzero(flags < value)
            if behind.size == 0:
                return
            j = int(behind[0])
            wait_until(lambda: int(flags[j]) >= value, what(j))

    def wait(self, ptr: int, value: int, what: str) -> None:
        """Acquire-spin until the 32-bit flag at `ptr` is >= value (ld.acquire.sys loop)."""
        flag = self.array(ptr, FLAG_DTYPE, 1)
        wait_until(lambda: int(flag[0]) >= value, what)
