"""The cuMem side shared by the peer backends whose workspaces are VMM memory (fabric, symm):
every rank's buffer, own or imported, mapped at its slot of one reserved VA range, so rank j's
workspace is at `va + j * slot` in every process (the sequence FlashInfer
MnnvlMemory, SymmDeviceMemory and PyTorch's map_block follow).

Teardown is split in two so a backend can put its multicast steps between them, in the
row G8 order: unmap the peers, (release multicast), release imports and own, free the VA.
"""

from __future__ import annotations

from typing import Any

from commsim.driver import access_desc, check
from commsim.kernels import workspace as W
from commsim.backends.base import PeerBackend


class VmmPeerBackend(PeerBackend):
    def __init__(self, *a: Any, **k: Any):
        super().__init__(*a, **k)
        self.own_handle = 0            # this rank's cuMemCreate handle
        self.imported: list[int] = []  # peers' handles imported into this process
        self.mapped: list[int] = []    # mapped slots, in rank order
        self.va = 0                    # base of the ws * slot reservation
        self.slot = 0                  # one rank's buffer, rounded to the granularity

    def map_peers(self, handles: list[int], device: int) -> None:
        """Reserve, map every rank's handle at its slot, grant this device access, zero this
        rank's flags (before any peer may signal them: the caller's next collective)."""
        d = self.driver
        self.va = check("cuMemAddressReserve", d.cuMemAddressReserve(self.slot * self.ws, 0, 0, 0))
        for j, h in enumerate(handles):
            p = self.va + j * self.slot
            check("cuMemMap", d.cuMemMap(p, self.slot, 0, h, 0))
            self.mapped.append(p)
        check("cuMemSetAccess", d.cuMemSetAccess(self.va, self.slot * self.ws, [access_desc(device)], 1))
        self.ptrs = list(self.mapped)
        check("cudaMemset", d.cudaMemset(self.ptrs[self.rank], 0, W.FLAGS_BYTES))

    def unmap_peers(self) -> None:
        for p in self.mapped:
            self.driver.cuMemUnmap(p, self.slot)
        self.mapped.clear()

    def release_peers(self) -> None:
        """Every imported handle needs its own release (row V14), then our own; the memory
        goes once the last reference anywhere is gone (row V13)."""
        d = self.driver
        for h in self.imported:
            d.cuMemRelease(h)
        self.imported.clear()
        if self.own_handle:
            d.cuMemRelease(self.own_handle)
            self.own_handle = 0
        if self.va:
            d.cuMemAddressFree(self.va, self.slot * self.ws)
            self.va = 0
