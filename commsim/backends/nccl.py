"""`nccl`: the fallback that always works. On the simulator the ring is carried by the group
layer (each rank's contribution travels by value, summed in float32 in rank order), which is
what NCCL's network path guarantees semantically: any placement, any size."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from ..discovery import GroupView
from ..kernels import collectives as K
from ..topology.truth import GroupFacts
from .base import Backend, Eligibility
from .registry import register_backend


@register_backend
class NcclBackend(Backend):
    """The fallback: a ring over the group's object exchange."""

    name = "nccl"
    order, colour = 100, "#9d9d9d"
    algorithms, cost_family = ("ring", "multicast"), "nccl"   # multicast: NVLS
    fallback = True

    @classmethod
    def truth(cls, facts: GroupFacts) -> str | None:
        return None                 # the network reaches everything

    @classmethod
    def eligibility(cls, view: GroupView, params: dict[str, Any]) -> Eligibility:
        return Eligibility(True)

    def algorithm(self, op: str, nbytes: int) -> str:
        return "ring"

    def run(self, op: str, x: torch.Tensor) -> torch.Tensor:
        self.round += 1
        parts = self.group.all_gather_object(x.contiguous().numpy() if x.dtype != torch.bfloat16
                                             else x.contiguous().view(torch.int16).numpy(),
                                             tag=f"nccl.{op}: ring round {self.round}")
        shapes = {tuple(p.shape) for p in parts}
        if len(shapes) != 1 and op != "all_gather":
            # Raise here, in Python: a torch shape error raised inside a rank's greenlet can
            # crash the process while torch walks the C++ stack (pytorch#117645).
            raise ValueError(f"nccl.{op}: ranks passed tensors of different shapes "
                             f"{[tuple(p.shape) for p in parts]} (round {self.round})")
        if op == "all_gather":
            ts = [torch.from_numpy(p) for p in parts]
            if x.dtype == torch.bfloat16:
                ts = [t.view(torch.bfloat16) for t in ts]
            return torch.cat(ts, dim=0)
        # A ring's reduce-scatter: this rank sums only its own chunk, in float32 and rank
        # order (O(message) per rank; every rank summing the whole message was O(ranks^2 x
        # message) in all); the all-gather of the reduced chunks follows for all_reduce.
        dtype = str(x.dtype).removeprefix("torch.")
        n = x.numel()
        if op == "reduce_scatter":
            per = n // self.ws
            lo, hi = self.rank * per, (self.rank + 1) * per
        else:
            lo, hi = K._chunks(n, self.ws)[self.rank]
        esz = x.element_size()
        mine = np.empty((hi - lo) * esz, np.uint8)
        if hi > lo:
            acc = K._reduce([p.reshape(-1).view(np.uint8)[lo * esz:hi * esz] for p in parts], dtype)
            K._store(acc, mine, dtype)
        # Drop the received copies before the next exchange: every rank parked in it would
        # hold ranks x message (by value, a copy per receiver).
        del parts
        if op == "reduce_scatter":
            return torch.from_numpy(mine).view(x.dtype)
        chunks = self.group.all_gather_object(mine, tag=f"nccl.{op}: ring all-gather {self.round}")
        return torch.from_numpy(np.concatenate(chunks)).view(x.dtype).reshape(x.shape)
