"""`nccl`: the fallback. On the simulator the data is carried by the group layer (each rank's
contribution travels by value, summed in float32 in rank order), which is what NCCL's
collectives guarantee semantically: any placement, any size.

What NCCL itself would choose is modelled by commsim/nccl_rules.py (docs/lifecycle-rules.md
NC1-NC12): at set-up the backend decides, from the discovery view and the NCCL_* variables
(`nccl_env`), each pair's transport and each collective's algorithm classes, and fails init
where NCCL does (a duplicate GPU: ncclInvalidUsage; MNNVL that looks available but whose
FABRIC self-test fails: ncclSystemError). With `nccl_auto_env` (default) the policy follows
NCCL's own advice for the latter and sets NCCL_MNNVL_ENABLE=0 before init."""

from __future__ import annotations

import functools
from typing import Any

import numpy as np
import torch

from ..discovery import GroupView
from ..kernels import collectives as K
from ..nccl_rules import NcclDecision, decide, machine_from_view, parse_env
from ..topology.truth import GroupFacts
from .base import Backend, Eligibility, SetupFailed
from .registry import register_backend


class NcclError(RuntimeError):
    """An NCCL init failure; `name` is the ncclResult_t (ncclInvalidUsage, ncclSystemError)."""

    def __init__(self, name: str, message: str):
        super().__init__(f"{name}: {message}")
        self.name = name


@functools.lru_cache(maxsize=8)
def _decide(view: GroupView, env: tuple[tuple[str, str], ...], auto: bool) -> tuple[NcclDecision, str]:
    """The decision for one group view and environment, and the note of an automatic
    adjustment. Cached: it is O(ranks^2) (a transport per pair), every rank of the group asks
    with an equal view, and the result is immutable, so the ranks of one process share one
    (576 ranks each holding their own 165,600 pair transports was gigabytes)."""
    machine = machine_from_view(view)
    envd = dict(env)
    d = decide(machine, parse_env(envd))
    if (d.init_error is not None and d.init_error[0] == "ncclSystemError" and auto
            and envd.get("NCCL_MNNVL_ENABLE") != "1"):
        d = decide(machine, parse_env({**envd, "NCCL_MNNVL_ENABLE": "0"}))
        return d, "NCCL_MNNVL_ENABLE=0 set: MNNVL looks available but IMEX is missing (NC8)"
    return d, ""


@register_backend
class NcclBackend(Backend):
    """The fallback: a ring over the group's object exchange, with NCCL's own choices
    (transports, algorithm classes, init failures) from commsim/nccl_rules.py."""

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

    decision: NcclDecision | None = None

    def setup(self) -> None:
        """ncclCommInitRank as the rules decide it. Every rank computes the same decision
        from the same view, so every rank fails init together (no vote needed)."""
        env = tuple(sorted(dict(self.params.get("nccl_env", ())).items()))
        d, self.adjusted = _decide(self.view, env, bool(self.params.get("nccl_auto_env", True)))
        self.decision = d
        if d.init_error is not None:
            raise SetupFailed(self.name, "init: ncclCommInitRank", self.rank, NcclError(*d.init_error))

    def describe(self) -> str:
        d = self.decision
        if d is None:
            return ""
        algos = "; ".join(f"{op} {'/'.join(d.algorithms(op))}" for op in ("all_reduce", "all_gather"))
        return f"{d.transport_summary()}; {algos}" + (f"; {self.adjusted}" if self.adjusted else "")

    def algorithm(self, op: str, nbytes: int) -> str:
        """The class the cost model knows it by (`algorithms`): "multicast" (NVLS) where NCCL
        may use it, else "ring" (its ring / tree family)."""
        d = self.decision
        if d is not None and ({"NVLS", "NVLSTree"} & set(d.algorithms(op))):
            return "multicast"
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
