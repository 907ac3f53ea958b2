"""`multicast`: NVLS-style all-reduce over a multicast object (NCCL NVLS, symm-mem multimem).

Requires (rows M1-M7): MULTICAST_SUPPORTED on every rank and one NVSwitch
domain. Within one host the multicast handle travels as a POSIX fd over a Unix socket; across
hosts it must be a FABRIC handle, so the fabric requirements apply too (row M7). Set-up as
FlashInfer SymmDeviceMemory._setup_multicast: rank 0 creates and exports, the handle is
broadcast, the others import, every rank adds its own device, binds its unicast memory at
offset 0, maps the multicast VA and sets access. Close in the G8 order.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from commsim.discovery import CONTAINERS, GroupView
from commsim.driver import FABRIC, FD, CudaError, FdTransportError, access_desc, alloc_prop, check, multicast_prop
from commsim.libmodels.fd_exchange import DEFAULT as DEFAULT_FD_TRANSPORT, transport as fd_transport
from commsim.kernels import collectives as K, workspace as W
from commsim.topology.model import FabricState
from commsim.topology.truth import FABRIC as FABRIC_HANDLE, POSIX_FD, GroupFacts
from commsim.backends.base import Backend, Eligibility, Mi, as_bytes, kernel_width
from commsim.backends.fabric import FabricBackend, round_up
from commsim.backends.registry import register_backend

# torch where a tensor is handled (run): the launcher of `exec` loads the backends, never runs one.
if TYPE_CHECKING:
    import torch


@register_backend
class MulticastBackend(Backend):
    max_ranks = W.MAX_RANKS          # one flag slot per rank (kernel_width)
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
        if not all(c.has_multicast_driver(g.host) for g in facts.gpus):
            return "a host's driver predates multicast objects (branch < 530, row M9)"
        if None in doms or len(doms) != 1:
            return "GPUs are not in one NVLink domain"
        if not all(g.fabric.state in (FabricState.COMPLETED, FabricState.NOT_SUPPORTED) for g in gs):
            # Row M3: binding fails SYSTEM_NOT_READY while the fabric manager is not done.
            return "some GPU's fabric state is not COMPLETED (row M3)"
        if facts.single_host:
            if not facts.nvl_all:       # the links, not the P2P fact (rows N1/N2)
                return "not every pair is NVLink-connected with its links up"
            if not facts.all_pairs_import(POSIX_FD):
                return "POSIX-fd handles unavailable"
            return None
        if not facts.all_pairs_import(FABRIC_HANDLE):
            return "across hosts the multicast handle must be FABRIC (row M7)"
        return None

    @classmethod
    def setup_fails(cls, facts: GroupFacts) -> str | None:
        """Failures no query reveals before set-up: a container without /dev/nvidia-caps
        refuses the object (row MC3); across hosts, hosts in different IMEX domains refuse the
        FABRIC-shared multicast handle (row I3)."""
        if facts.caps_missing:
            return facts.caps_missing
        return None if facts.single_host else facts.imex_split

    @classmethod
    def eligibility(cls, view: GroupView, params: dict[str, Any]) -> Eligibility:
        conds = [
            (view.size > 1, "a group of one rank needs no all-reduce"),
            kernel_width(view),
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
            conds.append((view.same_shm, CONTAINERS + "; the multicast handle cannot travel as a POSIX fd"))
            conds.append((all(r.posix_fd for r in view.ranks), "some rank lacks POSIX-fd handles"))
        else:
            # Multimem goes through the switch, not the peer path the functional probe tests.
            fab = FabricBackend.eligibility(view, {**params, "p2p_check": "flag"})
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
        pids = self.vote_and_share("init: create multicast object", err, d.getpid(),
                                   lambda p: self.group.all_gather_object(p, tag="multicast.init: exchange pids"))
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
                # POSIX fd over AF_UNIX to every peer of this host, by the policy's fd
                # transport (commsim/libmodels/fd_exchange.py, rules FX1-FX5).
                hosts = [r.host for r in self.view.ranks]
                t = fd_transport(self.params.get("fd_transport", DEFAULT_FD_TRANSPORT))
                fd = check("cuMemExportToShareableHandle",
                           d.cuMemExportToShareableHandle(self.mc_handle, FD, 0)) if self.rank == 0 else None
                try:
                    fd = t.broadcast(d, self.rank, 0, pids, hosts, fd)
                    if self.rank != 0:
                        self.mc_handle = check("cuMemImportFromShareableHandle",
                                               d.cuMemImportFromShareableHandle(fd, FD))
                finally:        # sent, or received and imported (or not): never kept open
                    if fd is not None:
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
        import torch
        return torch.from_numpy(raw).view(x.dtype).reshape(x.shape)   # raw is a fresh copy: no clone

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
