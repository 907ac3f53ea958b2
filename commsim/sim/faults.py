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
    """Faults for one process. `oom_at` = 1-based index of the allocation that fails."""

    oom_at: int | None = None
    calls: list[CallFault] = field(default_factory=list)
    _allocs: int = 0
    _counts: dict[str, int] = field(default_factory=dict)

    def before(self, api: str):
        """The code this call must fail with, or None to run it normally."""
        n = self._counts.get(api, 0) + 1
        self._counts[api] = n
        for f in self.calls:
            if f.api == api and f.nth == n:
                return f.code
        if api in ALLOCATING_CALLS:
            self._allocs += 1
            if self.oom_at is not None and self._allocs == self.oom_at:
                return cudart.cudaError_t.cudaErrorMemoryAllocation if api.startswith("cuda") \
                    else cu.CUresult.CUDA_ERROR_OUT_OF_MEMORY
        return None
