"""`fabric`: MNNVL all-reduce over cuMem FABRIC memory (FlashInfer mnnvl, TRT-LLM MNNVL).

Requires (rows V2-V8, F1-F4): on every rank VMM and the fabric-handle
attribute, an IMEX channel, NVML fabric state COMPLETED with success status, and one non-zero
cluster UUID over the group (one NVLink domain; NCCL's test). All ranks must agree, so the
check is over the all-gathered view (FlashInfer MnnvlMemory AND-reduces it).
Set-up: cuMemCreate(FABRIC) -> export -> all-gather -> import -> reserve one VA range ->
map each rank's handle at its slot -> set access. Graph buffers need no registration: the
workspace is pre-registered symmetric memory (vLLM#55835, row B10).
Close (row G8): sync, barrier, unmap every slot, release imports and own handle, free the VA.
"""

from __future__ import annotations

from typing import Any

from commsim.discovery import GroupView
from commsim.driver import FABRIC, CudaError, alloc_prop, check
from commsim.kernels import workspace as W
from commsim.topology.model import FabricState
from commsim.topology.truth import FABRIC as FABRIC_HANDLE, GroupFacts
from commsim.backends.base import Eligibility, Mi, kernel_width, probe_verdict
from commsim.backends.registry import register_backend
from commsim.backends.vmm import VmmPeerBackend


def round_up(n: int, g: int) -> int:
    return (n + g - 1) // g * g


@register_backend
class FabricBackend(VmmPeerBackend):
    max_ranks = W.MAX_RANKS          # one flag slot per rank (kernel_width)
    name = "fabric"
    order, colour = 20, "#59a14f"
    algorithms, cost_family = ("one-shot", "two-shot"), "lamport"

    @classmethod
    def truth(cls, facts: GroupFacts) -> str | None:
        if facts.ws < 2:
            return "a group of one rank"
        bad = facts.first_pair_without(FABRIC_HANDLE)
        if bad:
            return f"{bad[0]} cannot import a FABRIC handle of {bad[1]}"
        if facts.fabric_unreal:        # same-host FABRIC mappings ride the path the probe disproves
            return (f"the functional P2P probe {facts.fabric_unreal[0]} -> {facts.fabric_unreal[1]} fails "
                    f"(rows P1-P4): same-host FABRIC mappings ride that path")
        return None

    @classmethod
    def setup_fails(cls, facts: GroupFacts) -> str | None:
        """IMEX domain membership is reported by no query (row I3): the import fails at set-up."""
        return facts.imex_split

    @classmethod
    def eligibility(cls, view: GroupView, params: dict[str, Any]) -> Eligibility:
        rs = view.ranks

        def every(fails, says: str) -> tuple[bool, str]:
            # One pass; the failing ranks are named only when there are some (every rank of
            # every group asks, and symm and multicast ask again: mostly all hold).
            bad = [r.rank for r in rs if fails(r)]
            if not bad:
                return True, ""
            return False, (f"rank(s) {', '.join(map(str, bad[:6]))}{' ...' if len(bad) > 6 else ''} "
                           f"{says}")

        # Ranks of one host map each other's FABRIC memory over the same peer path a legacy
        # IPC mapping takes: where the functional probe finds it losing bytes, so do these.
        unreal = probe_verdict(view, params)
        return Eligibility.check([
            (view.size > 1, "a group of one rank needs no all-reduce"),
            kernel_width(view),
            every(lambda r: not r.vmm, "lack VMM support (cuMem*)"),
            every(lambda r: not r.fabric_handle, "lack HANDLE_TYPE_FABRIC_SUPPORTED (row V4)"),
            every(lambda r: not r.imex, "have no IMEX channel; cuMemCreate(FABRIC) "
                                        "would fail NOT_PERMITTED (row V3)"),
            every(lambda r: not (r.fabric_state == FabricState.COMPLETED and r.fabric_status == 0),
                  "report fabric state not COMPLETED/success (rows F1, F4)"),
            (view.same_fabric_domain(),
             "ranks do not share one non-zero NVML cluster UUID: not one NVLink domain (rows F2, V7)"),
            every(lambda r: not r.nvlinks_up, "have NVLinks down"),
            (not unreal, unreal),
        ])

    def algorithm(self, op: str, nbytes: int) -> str:
        # FlashInfer trtllm_mnnvl_ar AUTO: one-shot iff tokens*hidden*tp*elem <= 1 MiB.
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
        blobs = self.vote_and_share("init: create fabric memory", err, blob, lambda b: self.group.all_gather_object(
            b, tag="fabric.init: exchange fabric handles"))
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
