"""`fabric`: MNNVL all-reduce over cuMem FABRIC memory (FlashInfer mnnvl, TRT-LLM MNNVL).

Requires (reference §2.4, §4.2, rows V2-V8, F1-F4): on every rank VMM and the fabric-handle
attribute, an IMEX channel, NVML fabric state COMPLETED with success status, and one non-zero
cluster UUID over the group (one NVLink domain; NCCL's test). All ranks must agree, so the
check is over the all-gathered view (FlashInfer MnnvlMemory AND-reduces it, §4.2).
Set-up (§2.1): cuMemCreate(FABRIC) -> export -> all-gather -> import -> reserve one VA range ->
map each rank's handle at its slot -> set access. Graph buffers need no registration: the
workspace is pre-registered symmetric memory (vLLM#55835, row B10).
Close (row G8): sync, barrier, unmap every slot, release imports and own handle, free the VA.
"""

from __future__ import annotations

from typing import Any

from ..discovery import GroupView
from ..driver import FABRIC, CudaError, alloc_prop, check
from ..kernels import workspace as W
from ..topology.model import FabricState
from ..topology.truth import FABRIC as FABRIC_HANDLE, GroupFacts
from .base import Eligibility, Mi
from .registry import register_backend
from .vmm import VmmPeerBackend


def round_up(n: int, g: int) -> int:
    return (n + g - 1) // g * g


@register_backend
class FabricBackend(VmmPeerBackend):
    name = "fabric"
    order, colour = 20, "#59a14f"
    algorithms, cost_family = ("one-shot", "two-shot"), "lamport"

    @classmethod
    def truth(cls, facts: GroupFacts) -> str | None:
        if facts.ws < 2:
            return "a group of one rank"
        bad = facts.first_pair_without(FABRIC_HANDLE)
        return f"{bad[0]} cannot import a FABRIC handle of {bad[1]}" if bad else None

    @classmethod
    def eligibility(cls, view: GroupView, params: dict[str, Any]) -> Eligibility:
        def who(pred) -> str:
            bad = [r.rank for r in view.ranks if pred(r)]
            return ", ".join(map(str, bad[:6])) + (" ..." if len(bad) > 6 else "")

        rs = view.ranks
        return Eligibility.check([
            (view.size > 1, "a group of one rank needs no all-reduce"),
            (all(r.vmm for r in rs), f"rank(s) {who(lambda r: not r.vmm)} lack VMM support (cuMem*)"),
            (all(r.fabric_handle for r in rs),
             f"rank(s) {who(lambda r: not r.fabric_handle)} lack HANDLE_TYPE_FABRIC_SUPPORTED (row V4)"),
            (all(r.imex for r in rs),
             f"rank(s) {who(lambda r: not r.imex)} have no IMEX channel; cuMemCreate(FABRIC) "
             f"would fail NOT_PERMITTED (row V3)"),
            (all(r.fabric_state == FabricState.COMPLETED and r.fabric_status == 0 for r in rs),
             f"rank(s) {who(lambda r: not (r.fabric_state == FabricState.COMPLETED and r.fabric_status == 0))} "
             f"report fabric state not COMPLETED/success (rows F1, F4)"),
            (view.same_fabric_domain(),
             "ranks do not share one non-zero NVML cluster UUID: not one NVLink domain (rows F2, V7)"),
            (all(r.nvlinks_up for r in rs),
             f"rank(s) {who(lambda r: not r.nvlinks_up)} have NVLinks down (§4.2)"),
        ])

    def algorithm(self, op: str, nbytes: int) -> str:
        # FlashInfer trtllm_mnnvl_ar AUTO: one-shot iff tokens*hidden*tp*elem <= 1 MiB (§6.3).
        if op not in ("all_reduce", "all_reduce_rmsnorm"):
            return "direct"
        return "one-shot" if nbytes * self.ws <= 1 * Mi else "two-shot"

    def setup(self) -> None:
        d, me = self.driver, check("cudaGetDevice", self.driver.cudaGetDevice())
        prop = alloc_prop(me, FABRIC)
        err, blob = None, None
        try:
            gran = check("cuMemGetAllocationGranularity", d.cuMemGetAllocationGranularity(prop, 1))
            self.slot = round_up(W.workspace_bytes(self.capacity), gran)
            self.own_handle = check("cuMemCreate", d.cuMemCreate(self.slot, prop, 0))
            blob = check("cuMemExportToShareableHandle",
                         d.cuMemExportToShareableHandle(self.own_handle, FABRIC, 0))
        except CudaError as e:
            err = e
        self.vote("init: create fabric memory", err)
        blobs = self.group.all_gather_object(blob, tag="fabric.init: exchange fabric handles")
        err = None
        try:
            handles = []
            for j, b in enumerate(blobs):
                if j == self.rank:
                    handles.append(self.own_handle)
                else:
                    h = check("cuMemImportFromShareableHandle", d.cuMemImportFromShareableHandle(b, FABRIC))
                    self.imported.append(h)
                    handles.append(h)
            self.map_peers(handles, me)
        except CudaError as e:
            err = e
        self.vote("init: import and map peers", err)

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        d = self.driver
        d.cudaDeviceSynchronize()
        self.close_barrier("fabric.close: all ranks done with peer memory")
        self.unmap_peers()
        self.release_peers()
