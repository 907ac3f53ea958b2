"""`multicast`: NVLS-style all-reduce over a multicast object (NCCL NVLS, symm-mem multimem).

Requires (reference §3, rows M1-M7): MULTICAST_SUPPORTED on every rank and one NVSwitch
domain. Within one host the multicast handle travels as a POSIX fd over a Unix socket; across
hosts it must be a FABRIC handle, so the fabric requirements apply too (row M7). Set-up as
FlashInfer SymmDeviceMemory._setup_multicast (§3.2): rank 0 creates and exports, the handle is
broadcast, the others import, every rank adds its own device, binds its unicast memory at
offset 0, maps the multicast VA and sets access. Close in the G8 order.
"""

from __future__ import annotations

from typing import Any

import torch

from ..discovery import GroupView
from ..driver import FABRIC, FD, CudaError, FdTransportError, access_desc, alloc_prop, check, multicast_prop
from ..kernels import collectives as K, workspace as W
from ..topology.model import FabricState
from ..topology.truth import FABRIC as FABRIC_HANDLE, POSIX_FD, GroupFacts
from .base import Backend, Eligibility, Mi, as_bytes
from .fabric import FabricBackend, round_up
from .registry import register_backend


@register_backend
class MulticastBackend(Backend):
    name = "multicast"
    ops = ("all_reduce", "all_reduce_rmsnorm")
    order, colour = 30, "#f28e2b"
    algorithms, cost_family = ("multicast",), "multimem"
    limit_param, default_limit = "multicast_max_size", 64 * Mi

    @classmethod
    def truth(cls, facts: GroupFacts) -> str | None:
        if facts.ws < 2:
            return "a group of one rank"
        c = facts.cluster
        gs = [c.gpu(g) for g in facts.gpus]
        doms = {id(c.domain_of(g)) if c.domain_of(g) is not None else None for g in facts.gpus}
        if not all(g.multicast and g.vmm for g in gs):
            return "some GPU lacks multicast or VMM (row M1)"
        if None in doms or len(doms) != 1:
            return "GPUs are not in one NVLink domain"
        if not all(g.fabric.state in (FabricState.COMPLETED, FabricState.NOT_SUPPORTED) for g in gs):
            # Row M3: binding fails SYSTEM_NOT_READY while the fabric manager is not done.
            return "some GPU's fabric state is not COMPLETED (row M3)"
        if facts.single_host:
            if not facts.nvl_all:
                return "not every pair is NVLink + P2P"
            if not facts.all_pairs_import(POSIX_FD):
                return "POSIX-fd handles unavailable"
            return None
        if not facts.all_pairs_import(FABRIC_HANDLE):
            return "across hosts the multicast handle must be FABRIC (row M7)"
        return None

    @classmethod
    def eligibility(cls, view: GroupView, params: dict[str, Any]) -> Eligibility:
        conds = [
            (view.size > 1, "a group of one rank needs no all-reduce"),
            (all(r.multicast and r.vmm for r in view.ranks),
             "some rank lacks MULTICAST_SUPPORTED (row M1: no NVSwitch / fabric manager)"),
            # NVLS needs the fabric manager done: cuMulticastBindMem answers SYSTEM_NOT_READY
            # otherwise (row M3), also on one host.
            (all(r.fabric_state == FabricState.COMPLETED for r in view.ranks),
             "some rank reports NVML fabric state not COMPLETED (row M3: multicast bind would "
             "fail SYSTEM_NOT_READY)"),
        ]
        if view.single_host:
            conds.append((view.nvlink_all(), "GPUs are not all on one NVSwitch (not fully NVLink-connected)"))
            conds.append((all(r.posix_fd for r in view.ranks), "some rank lacks POSIX-fd handles"))
        else:
            fab = FabricBackend.eligibility(view, params)
            conds += [(False, f"across hosts the multicast handle must be FABRIC (row M7): {why}")
                      for why in fab.reasons]
        return Eligibility.check(conds)

    def algorithm(self, op: str, nbytes: int) -> str:
        return "multimem"

    def accepts(self, op: str, nbytes: int, dtype: str) -> tuple[bool, str]:
        ok, why = super().accepts(op, nbytes, dtype)
        if not ok:
            return ok, why
        if nbytes >= self.capacity:
            return False, f"{nbytes} B >= multicast workspace {self.capacity} B"
        return True, ""

    def __init__(self, *a: Any, **k: Any):
        super().__init__(*a, **k)
        self.capacity = self.limit(self.params)
        self.types = FD if self.view.single_host else FABRIC
        self.uc_handle = self.mc_handle = 0
        self.uc = self.mc = 0
        self.size = 0
        self.bound = False
        self.mapped: list[tuple[int, int]] = []

    def setup(self) -> None:
        d = self.driver
        me = check("cudaGetDevice", d.cudaGetDevice())
        err = None
        try:
            mprop = multicast_prop(self.ws, 0, self.types)
            gran = check("cuMulticastGetGranularity", d.cuMulticastGetGranularity(mprop, 1))
            self.size = round_up(W.workspace_bytes(self.capacity), gran)
            self.uc_handle = check("cuMemCreate", d.cuMemCreate(self.size, alloc_prop(me, self.types), 0))
            if self.rank == 0:
                self.mc_handle = check("cuMulticastCreate",
                                       d.cuMulticastCreate(multicast_prop(self.ws, self.size, self.types)))
        except CudaError as e:
            err = e
        self.vote("init: create multicast object", err)
        pids = self.group.all_gather_object(d.getpid(), tag="multicast.init: exchange pids")
        err = None
        try:
            if self.types == FABRIC:
                blob = check("cuMemExportToShareableHandle",
                             d.cuMemExportToShareableHandle(self.mc_handle, FABRIC, 0)) if self.rank == 0 else None
                blob = self.group.broadcast_object(blob, 0, tag="multicast.init: broadcast handle")
                if self.rank != 0:
                    self.mc_handle = check("cuMemImportFromShareableHandle",
                                           d.cuMemImportFromShareableHandle(blob, FABRIC))
            else:
                # POSIX fd over AF_UNIX to every peer of this host (PyTorch IpcChannel, §2.5).
                if self.rank == 0:
                    fd = check("cuMemExportToShareableHandle", d.cuMemExportToShareableHandle(self.mc_handle, FD, 0))
                    for p in pids[1:]:
                        d.fd_channel().send(fd, p)
                    d.close_fd(fd)
                else:
                    fd = d.fd_channel().receive(pids[0])
                    try:
                        self.mc_handle = check("cuMemImportFromShareableHandle",
                                               d.cuMemImportFromShareableHandle(fd, FD))
                    finally:        # a failed import must not keep the received fd open
                        d.close_fd(fd)
            check("cuMulticastAddDevice", d.cuMulticastAddDevice(self.mc_handle, me))
        except (CudaError, FdTransportError) as e:
            err = e
        self.vote("init: share multicast handle", err)
        err = None
        try:
            check("cuMulticastBindMem", d.cuMulticastBindMem(self.mc_handle, 0, self.uc_handle, 0, self.size, 0))
            self.bound = True
            for name, h in (("uc", self.uc_handle), ("mc", self.mc_handle)):
                va = check("cuMemAddressReserve", d.cuMemAddressReserve(self.size, 0, 0, 0))
                self.mapped.append((va, 0))
                check("cuMemMap", d.cuMemMap(va, self.size, 0, h, 0))
                self.mapped[-1] = (va, 1)
                check("cuMemSetAccess", d.cuMemSetAccess(va, self.size, [access_desc(me)], 1))
                setattr(self, name, va)
            check("cudaMemset", d.cudaMemset(self.uc, 0, W.FLAGS_BYTES))
        except CudaError as e:
            err = e
        self.vote("init: bind and map", err)

    def run(self, op: str, x: torch.Tensor) -> torch.Tensor:
        dtype = str(x.dtype).removeprefix("torch.")
        nbytes = x.numel() * x.element_size()
        check("cudaMemcpy", self.driver.memcpy_htod(self.uc + W.DATA, as_bytes(x)))
        self.round += 1
        check("multimem_all_reduce", self.driver.launch_kernel(
            K.multimem_all_reduce, self.mc, self.uc, self.rank, self.ws, x.numel(), dtype,
            self.capacity, self.round))
        raw = check("cudaMemcpy", self.driver.memcpy_dtoh(self.uc + W.DATA + self.capacity, nbytes))
        return torch.from_numpy(raw).view(x.dtype).reshape(x.shape).clone()

    def close(self) -> None:
        """Row G8: sync, barrier, unbind, unmap multicast, unmap unicast, release both."""
        if self.closed:
            return
        self.closed = True
        d = self.driver
        d.cudaDeviceSynchronize()
        self.close_barrier("multicast.close: all ranks done")
        if self.bound:
            d.cuMulticastUnbind(self.mc_handle, check("cudaGetDevice", d.cudaGetDevice()), 0, self.size)
        for va, mapped in reversed(self.mapped):
            if mapped:
                d.cuMemUnmap(va, self.size)
            d.cuMemAddressFree(va, self.size)
        self.mapped.clear()
        if self.mc_handle:
            d.cuMemRelease(self.mc_handle)
        if self.uc_handle:
            d.cuMemRelease(self.uc_handle)
        self.mc_handle = self.uc_handle = 0
