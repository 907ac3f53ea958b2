"""`nccl`: the fallback that always works. On the simulator the ring is carried by the group
layer (each rank's contribution travels by value, summed in float32 in rank order), which is
what NCCL's network path guarantees semantically: any placement, any size."""

from __future__ import annotations

from typing import Any

import torch

from ..discovery import GroupView
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
        ts = [torch.from_numpy(p) for p in parts]
        if x.dtype == torch.bfloat16:
            ts = [t.view(torch.bfloat16) for t in ts]
        if op == "all_gather":
            return torch.cat(ts, dim=0)
        acc = torch.zeros(x.shape, dtype=torch.float32)
        for t in ts:
            acc += t.float()
        out = acc.to(x.dtype)
        if op == "reduce_scatter":
            return out.reshape(-1).chunk(self.ws)[self.rank].clone()
        return out
