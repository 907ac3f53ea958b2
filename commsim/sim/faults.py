"""Driver faults as data: allocation failure at the k-th allocation, a call failing with a code.

Topology faults (IMEX missing, fabric state, P2P off ...) are edits of the cluster
(`commsim.topology.modify`); these are about calls a process makes, so they live per process.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from cuda.bindings import driver as cu
from cuda.bindings import runtime as cudart

ALLOCATING_CALLS = ("cudaMalloc", "cuMemCreate")


def code_by_name(name: str):
    """A cudaError_t or CUresult member by name (`cudaErrorInvalidValue`, `CUDA_ERROR_...`)."""
    for enum in (cudart.cudaError_t, cu.CUresult):
        if name in enum.__members__:
            return getattr(enum, name)   # cuda-python enums are not subscriptable
    raise KeyError(name)


@dataclass
class CallFault:
    api: str
    code: object
    nth: int = 1


@dataclass
class ProcessFaults:
    """Faults for one process. `oom_at` = 1-based index of the allocation that fails.
    The driver's @api wrapper counts every call in `counts`, armed or not (a fault armed later
    still finds its nth call), and asks `forced` only while a fault is armed."""

    oom_at: int | None = None
    calls: list[CallFault] = field(default_factory=list)
    counts: dict[str, int] = field(default_factory=dict)     # calls made so far, per api

    def forced(self, api: str, n: int):
        """The code the `n`th call of `api` (counted already) must fail with, or None."""
        for f in self.calls:
            if f.api == api and f.nth == n:
                return f.code
        if self.oom_at is not None and api in ALLOCATING_CALLS and self._allocations() == self.oom_at:
            return cudart.cudaError_t.cudaErrorMemoryAllocation if api.startswith("cuda") \
                else cu.CUresult.CUDA_ERROR_OUT_OF_MEMORY
        return None

    def _allocations(self) -> int:
        """Allocating calls made so far, this one included."""
        return sum(self.counts.get(a, 0) for a in ALLOCATING_CALLS)
