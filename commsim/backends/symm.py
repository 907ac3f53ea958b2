"""`symm`: a symmetric-memory all-reduce built on a store rendezvous (PyTorch
`torch.distributed._symmetric_memory`, FlashInfer SymmDeviceMemory, NCCL symmetric
registration).

Every rank allocates one cuMem buffer of the same size, the handles meet in the group's
store, every rank maps every peer's buffer, and where the hardware allows a multicast object
is bound over the buffers. The handle type is chosen per *group*, from the all-gathered view:
POSIX fd when the group shares one host's socket namespace (the fd itself travels over
AF_UNIX, row V9), FABRIC across hosts of one NVLink domain (rows V2-V8). PyTorch reports
a group without multicast as `multicast_ptr == 0` and still serves peer-pointer kernels
(row M8); so does this backend.

Set-up as PyTorch and FlashInfer do it, each step voted so one rank's failure rolls all back:
  allocate   cuMemCreate(slot) + export (fd or fabric blob)
  rendezvous store exchange under `symm/<group>/<n>/<type>`; fds over the Unix socket
  map        reserve one VA range, map every rank's buffer at its slot, set access
  multicast  rank 0 creates, the handle is shared, each rank adds its own device, binds its
             buffer, maps the multicast VA (optional; skipped where multicast is not legal)
Close in the row G8 order: sync, barrier, unbind, unmap multicast, unmap peers, release
multicast, release imports, release own, free the VA.

Three knobs reproduce field bugs of this class (scenarios/policies/):
  agree=False              rank-local set-up decisions, no votes (base.Backend.vote)
  symm_handle_type="local" handle type from the rank's own probe, not the group's (row V16)
  symm_handle_type="fd"    POSIX fd forced, also across hosts (sglang on GB200, row B20)
  symm_rendezvous_counter="process"  one rendezvous counter per process instead of per group,
                           so a subgroup rendezvous shifts the world's keys on its members only
  fd_transport="pytorch_ring" | "flashinfer_mesh"  how POSIX fds travel (commsim/libmodels/fd_exchange.py)
"""

from __future__ import annotations

import weakref
from typing import TYPE_CHECKING, Any

from commsim.discovery import GroupView, RankInfo
from commsim.driver import FABRIC, FD, CudaError, FdTransportError, access_desc, alloc_prop, check, multicast_prop
from commsim.libmodels.fd_exchange import DEFAULT as DEFAULT_FD_TRANSPORT, transport as fd_transport
from commsim.kernels import collectives as K, workspace as W
from commsim.topology.truth import FABRIC as FABRIC_HANDLE, POSIX_FD, GroupFacts
from commsim.backends.base import Eligibility, Mi, SetupFailed, kernel_width, probe_verdict
from commsim.backends.fabric import FabricBackend, round_up
from commsim.backends.multicast import MulticastBackend

# torch where a tensor is handled (run): the launcher of `exec` loads the backends, never runs one.
if TYPE_CHECKING:
    import torch
from commsim.backends.registry import register_backend
from commsim.backends.vmm import VmmPeerBackend

# vLLM SYMM_MEM_ALL_REDUCE_MAX_SIZES: 64 MiB for SM 9.0 at world sizes 2, 6 and 8.
DEFAULT_MAX_SIZE = 64 * Mi
HANDLE_NAMES = {FD: "fd", FABRIC: "fabric"}

# Rendezvous counters per simulated process (the Driver stands for the process): per group
# name, or one shared entry "*" under symm_rendezvous_counter="process".
_COUNTERS: "weakref.WeakKeyDictionary[Any, dict[str, int]]" = weakref.WeakKeyDictionary()


def group_handle_type(view: GroupView) -> int:
    """The group-agreed choice: fd within one shm / socket namespace (rows V9, F7), FABRIC
    across hosts (row M7). Every rank computes it from the same view."""
    return FD if view.same_shm else FABRIC


def local_handle_type(me: RankInfo) -> int:
    """FlashInfer SymmDeviceMemory / PyTorch's allocator without an AND-reduction: FABRIC
    when this rank's own probe says fabric works, fd otherwise (row V16)."""
    return FABRIC if me.mnnvl_capable else FD


@register_backend
class SymmBackend(VmmPeerBackend):
    max_ranks = W.MAX_RANKS          # one flag slot per rank (kernel_width)
    name = "symm"
    order, colour, plot_style = 40, "#b07aa1", "--"   # dashed: its multimem curve is multicast's
    algorithms, cost_family = ("one-shot", "two-shot", "multicast"), "peer"
    limit_param, default_limit = "symm_max_size", DEFAULT_MAX_SIZE

    @classmethod
    def truth(cls, facts: GroupFacts) -> str | None:
        if facts.ws < 2:
            return "a group of one rank"
        if facts.one_shm_namespace:
            # One socket namespace: the symmetric buffers travel as POSIX fds and peers
            # load and store through the mappings over NVLink P2P (rows L10, B3).
            bad = facts.first_pair_without(POSIX_FD)
            if bad:
                return f"{bad[0]} cannot import a POSIX-fd handle of {bad[1]}"
            if not facts.p2p_all:
                return "not every pair has P2P (row L10)"
            if facts.unreal:
                return (f"the functional P2P probe {facts.unreal[0]} -> {facts.unreal[1]} fails "
                        f"(rows P1-P4)")
            return None if facts.nvl_all else "not every pair is NVLink-connected (row B3)"
        bad = facts.first_pair_without(FABRIC_HANDLE)
        if bad:
            return f"across hosts: {bad[0]} cannot import a FABRIC handle of {bad[1]}"
        if facts.fabric_unreal:
            return (f"the functional P2P probe {facts.fabric_unreal[0]} -> {facts.fabric_unreal[1]} fails (rows "
                    f"P1-P4): same-host peer mappings ride that path")
        return None

    @classmethod
    def setup_fails(cls, facts: GroupFacts) -> str | None:
        """Across hosts the buffers travel as FABRIC handles: hosts in different IMEX domains
        refuse the import at set-up, and no query reveals it beforehand (row I3)."""
        return None if facts.one_shm_namespace else facts.imex_split

    @classmethod
    def eligibility(cls, view: GroupView, params: dict[str, Any]) -> Eligibility:
        rs = view.ranks
        conds = [(view.size > 1, "a group of one rank needs no all-reduce"),
                 kernel_width(view),
                 (all(r.vmm for r in rs), "some rank lacks VMM support (cuMem*)")]
        if group_handle_type(view) == FD:
            conds.append((all(r.posix_fd for r in rs), "some rank lacks POSIX-fd handles"))
            # Peer loads and stores through a mapped peer buffer ride the device-to-device
            # path: without P2P they fault, as a legacy IPC open is refused (row L10). Over
            # PCIe P2P the kernels would crawl, so NVLink is required as for custom all-reduce
            # beyond two GPUs (row B3); vLLM enables torch symm-mem only on SM 9.0 / 10.x NVLink
            # parts.
            bad = None if view.p2p_all() else next((a.rank, b.rank) for a, b in view.pairs()
                                                   if not a.can_access(b))
            conds.append((bad is None, f"no P2P from rank {bad[0]} to rank {bad[1]}: peer loads "
                                       f"and stores of mapped symmetric memory need P2P (row L10)"
                          if bad else ""))
            if bad is None:
                # Peer loads and stores ride the same path a legacy IPC mapping does: where
                # the functional probe finds it refused or losing bytes, so do these (P1-P4).
                unreal = probe_verdict(view, params)
                conds.append((not unreal, unreal))
                conds.append((view.nvlink_all(), "GPUs are not all NVLink-connected: symmetric-"
                                                 "memory kernels over PCIe P2P are not used (row B3)"))
        else:
            conds += [(False, f"across hosts symmetric memory must use FABRIC handles (row "
                              f"V9): {why}") for why in FabricBackend.eligibility(view, params).reasons]
        return Eligibility.check(conds)

    def __init__(self, *a: Any, **k: Any):
        super().__init__(*a, **k)
        self.htype = self._handle_type()
        self.want_multicast = (self.params.get("symm_multicast", True)
                               and MulticastBackend.admitted(self.view, self.params).ok)
        self.own_fd: int | None = None   # the exported fd, until sent (or closed by close())
        self.mc_handle = 0
        self.mc = 0                 # the multicast address; 0 without multicast (row M8)
        self.mc_mapped = False
        self.bound = False
        self.mc_note = ""           # why multicast was dropped after a failed set-up (row S1)

    def _handle_type(self) -> int:
        how = self.params.get("symm_handle_type", "group")
        if how == "local":
            return local_handle_type(self.view.ranks[self.rank])
        if how == "fd":
            return FD
        return group_handle_type(self.view)

    def _per_process_counter(self) -> bool:
        return self.params.get("symm_rendezvous_counter", "group") == "process"

    def _key(self, what: str) -> str:
        """The store key of this rendezvous. The counter is per group, so every member's n-th
        rendezvous in a group has the same key whatever else each took part in."""
        counters = _COUNTERS.setdefault(self.driver, {})
        scope = "*" if self._per_process_counter() else self.group.name
        n = counters.get(scope, 0)
        counters[scope] = n + 1
        return f"symm/{self.group.name}/{n}/{what}"

    def _voted_exchange(self, step: str, error: Exception | None, what: str, value: Any,
                        tag: str) -> list[Any]:
        """The vote on `step` and this rendezvous' store exchange in one (vote_and_share). A
        failure voted there gives the key's number back, so later keys are what they were with
        the vote first (no rank reached the rendezvous then). Under the per-process counter
        the members' keys may differ (the bug that knob reproduces), so the verdict goes by a
        vote of its own first, which reaches every member whatever their keys."""
        if self._per_process_counter():
            self.vote(step, error)
            return self.group.exchange(self._key(what), value, tag=tag)
        counted = False

        def share(v: Any) -> list[Any]:
            nonlocal counted
            key = self._key(what)
            counted = True
            return self.group.exchange(key, v, tag=tag)
        try:
            return self.vote_and_share(step, error, value, share)
        except SetupFailed:
            if counted:
                _COUNTERS[self.driver][self.group.name] -= 1
            raise

    def algorithm(self, op: str, nbytes: int) -> str:
        if op not in ("all_reduce", "all_reduce_rmsnorm"):
            return "direct"
        if self.want_multicast:    # set up or voted away together, so this is mc != 0
            return "multimem"       # PyTorch multimem_all_reduce_ over the multicast address
        # Without multicast: one-shot while bytes * ws <= 1 MiB, as FlashInfer's
        # SymmDeviceMemory-based MNNVL all-reduce decides, two-shot beyond.
        return "one-shot" if nbytes * self.ws <= 1 * Mi else "two-shot"

    # -- set-up ----------------------------------------------------------------------------
    def setup(self) -> None:
        d = self.driver
        me = check("cudaGetDevice", d.cudaGetDevice())
        err, mine = None, None
        try:
            prop = alloc_prop(me, self.htype)
            gran = check("cuMemGetAllocationGranularity", d.cuMemGetAllocationGranularity(prop, 1))
            self.slot = round_up(W.workspace_bytes(self.capacity), gran)
            self.own_handle = check("cuMemCreate", d.cuMemCreate(self.slot, prop, 0))
            mine = check("cuMemExportToShareableHandle",
                         d.cuMemExportToShareableHandle(self.own_handle, self.htype, 0))
            if self.htype == FD:
                self.own_fd = mine
        except CudaError as e:
            err = e
        alloc_err, err = err, None
        try:
            # The allocation's vote travels with the rendezvous exchange (_voted_exchange).
            self.map_peers(self._rendezvous(mine, alloc_err), me)
        except (CudaError, FdTransportError) as e:
            err = e
        self.vote("init: rendezvous and map peers", err)
        if self.want_multicast:
            try:
                self._setup_multicast(me)
            except SetupFailed as e:
                # Row S1: PyTorch's rendezvous carries on without multicast when set-up fails
                # on GPUs whose attribute says it is supported (pytorch/pytorch#136577): the
                # address stays 0, the backend stays up, and it says so. Every rank got the
                # same voted failure, so every rank drops the multicast part together.
                self._drop_multicast()
                self.want_multicast = False
                self.mc_note = (f"multicast set-up failed ({e.step}: rank {e.rank}: {e.error}); "
                                f"carrying on with multicast address 0 (row S1)")
        if not self.params.get("agree", True):
            # PyTorch's rendezvous ends in a store barrier: no peer signals a flag before
            # every rank has zeroed its own. With votes the last vote is that barrier: every
            # rank zeroed its flags (map_peers) before the map vote, and leaves the last vote
            # only once every rank has arrived in it.
            self.group.barrier(tag="symm.init: rendezvous done")

    def _rendezvous(self, mine: Any, alloc_err: Exception | None) -> list[int]:
        """Every rank's buffer as a handle in this process (own handle at own rank); the
        allocation's vote (`alloc_err`: this rank's failure) goes with the first exchange."""
        d, kind = self.driver, HANDLE_NAMES[self.htype]
        step = "init: allocate symmetric buffer"
        if self.htype == FABRIC:
            blobs = self._voted_exchange(step, alloc_err, "fabric", mine,
                                         tag="symm.init: exchange fabric handles")
            out = []
            for j, b in enumerate(blobs):
                if j == self.rank:
                    out.append(self.own_handle)
                    continue
                h = check("cuMemImportFromShareableHandle", d.cuMemImportFromShareableHandle(b, FABRIC))
                self.imported.append(h)
                out.append(h)
            return out
        if self.params.get("symm_fd_exchange") == "pidfd":
            # Row W7: the fds are pulled with pidfd_getfd, not passed over sockets; this
            # choice is the exchange mechanism itself, so it comes before the socket transport.
            return self._rendezvous_pidfd(mine, self._voted_exchange(
                step, alloc_err, "pidfd", (d.getpid(), mine), tag="symm.init: exchange pids and fds"))
        # POSIX fd: pids meet in the store, then the fds travel by the policy's fd
        # transport: PyTorch's ring (default) or FlashInfer's mesh (rules FX1-FX5).
        pids = self._voted_exchange(step, alloc_err, kind, d.getpid(), tag="symm.init: exchange pids")
        try:
            fds = self._fd_transport().all_gather(d, self.rank, pids, self._hosts(), mine)
        finally:
            d.close_fd(mine)
            self.own_fd = None
        out = [0] * self.ws
        out[self.rank] = self.own_handle
        try:
            for j, fd in enumerate(fds):
                if j != self.rank:
                    h = check("cuMemImportFromShareableHandle", d.cuMemImportFromShareableHandle(fd, FD))
                    self.imported.append(h)
                    out[j] = h
        finally:
            for j, fd in enumerate(fds):
                if j != self.rank:
                    d.close_fd(fd)
        return out

    def _fd_transport(self):
        return fd_transport(self.params.get("fd_transport", DEFAULT_FD_TRANSPORT))

    def _hosts(self) -> list[str]:
        return [r.host for r in self.view.ranks]

    def _import_fd(self, fd: int) -> int:
        """Import a peer's buffer from a received fd, then close the fd (the handle keeps it)."""
        d = self.driver
        try:
            h = check("cuMemImportFromShareableHandle", d.cuMemImportFromShareableHandle(fd, FD))
        finally:
            d.close_fd(fd)
        self.imported.append(h)
        return h

    def _setup_multicast(self, me: int) -> None:
        """FlashInfer SymmDeviceMemory._setup_multicast: rank 0 creates and shares the
        object, every rank adds its own device, then binds its buffer at offset 0 and maps the
        VA. Each step is voted: a rank that binds before every device joined blocks (row M2),
        and a peer waiting for rank 0's handle must learn that rank 0 failed to create it."""
        d = self.driver
        err, blob = None, None
        try:
            if self.rank == 0:
                self.mc_handle = check("cuMulticastCreate", d.cuMulticastCreate(
                    multicast_prop(self.ws, self.slot, self.htype)))
                blob = check("cuMemExportToShareableHandle",
                             d.cuMemExportToShareableHandle(self.mc_handle, self.htype, 0))
        except CudaError as e:
            err = e
        create_err, err = err, None
        try:
            self._share_multicast(blob, create_err)
            check("cuMulticastAddDevice", d.cuMulticastAddDevice(self.mc_handle, me))
        except (CudaError, FdTransportError) as e:
            err = e
        self.vote("init: share multicast object", err)
        err = None
        try:
            check("cuMulticastBindMem", d.cuMulticastBindMem(self.mc_handle, 0, self.own_handle, 0, self.slot, 0))
            self.bound = True
            va = check("cuMemAddressReserve", d.cuMemAddressReserve(self.slot, 0, 0, 0))
            self.mc = va
            check("cuMemMap", d.cuMemMap(va, self.slot, 0, self.mc_handle, 0))
            self.mc_mapped = True
            check("cuMemSetAccess", d.cuMemSetAccess(va, self.slot, [access_desc(me)], 1))
        except CudaError as e:
            err = e
        self.vote("init: bind and map multicast", err)

    def _rendezvous_pidfd(self, mine: int, pairs: list[tuple[int, int]]) -> list[int]:
        """The pidfd_getfd exchange (row W7): the (pid, fd) pairs met in the store, every rank
        pulls each peer's fd, and the owners close theirs only after everyone pulled."""
        d = self.driver
        out = [0] * self.ws
        out[self.rank] = self.own_handle
        err = None
        try:
            for j, (pid, fd) in enumerate(pairs):
                if j == self.rank:
                    continue
                pull = getattr(d.fd_channel(), "pull", None)
                if pull is None:
                    raise FdTransportError(95, "EOPNOTSUPP: this driver's fd channel has no "
                                               "pidfd_getfd")
                out[j] = self._import_fd(pull(pid, fd))
        except (CudaError, FdTransportError) as e:
            err = e
        self.group.barrier(tag="symm.init: every peer pulled the fds")
        d.close_fd(mine)
        self.own_fd = None
        if err is not None:
            raise err
        return out

    def _drop_multicast(self) -> None:
        """Undo a partial multicast set-up on this rank (unbind, unmap, free, release)."""
        self._unbind_unmap_multicast()
        if self.mc_handle:
            self.driver.cuMemRelease(self.mc_handle)
            self.mc_handle = 0

    def _unbind_unmap_multicast(self) -> None:
        d = self.driver
        if self.bound:
            d.cuMulticastUnbind(self.mc_handle, check("cudaGetDevice", d.cudaGetDevice()), 0, self.slot)
            self.bound = False
        if self.mc:
            if self.mc_mapped:
                d.cuMemUnmap(self.mc, self.slot)
                self.mc_mapped = False
            d.cuMemAddressFree(self.mc, self.slot)
            self.mc = 0

    def _share_multicast(self, blob: Any, create_err: Exception | None) -> None:
        """Rank 0's exported multicast handle to every other rank: a fabric blob through the
        store, or an fd over each peer's Unix socket after the pids meet in the store. The
        vote on rank 0's create (`create_err`) goes with that store exchange."""
        d = self.driver
        step = "init: create multicast object"
        if self.htype == FABRIC:
            blob = self._voted_exchange(step, create_err, "multicast", blob,
                                        tag="symm.init: share multicast handle")[0]
            if self.rank != 0:
                self.mc_handle = check("cuMemImportFromShareableHandle",
                                       d.cuMemImportFromShareableHandle(blob, FABRIC))
            return
        pids = self._voted_exchange(step, create_err, "multicast", d.getpid(),
                                    tag="symm.init: share multicast handle")
        try:
            fd = self._fd_transport().broadcast(d, self.rank, 0, pids, self._hosts(),
                                                blob if self.rank == 0 else None)
        finally:
            if self.rank == 0:
                d.close_fd(blob)
        if self.rank != 0:
            try:
                self.mc_handle = check("cuMemImportFromShareableHandle", d.cuMemImportFromShareableHandle(fd, FD))
            finally:
                d.close_fd(fd)

    def describe(self) -> str:
        mc = ("multicast object bound, multimem all-reduce" if self.mc else
              self.mc_note or "multicast address 0: no multicast for this group (row M8)")
        return f"{HANDLE_NAMES[self.htype]} handles, {mc}"

    # -- the op ----------------------------------------------------------------------------
    def run(self, op: str, x: torch.Tensor) -> torch.Tensor:
        # Row S2: code that needs multimem must check the multicast address; a policy with
        # `symm_multimem_unchecked` reproduces one that does not, and its kernel then runs over
        # address 0 (row MC6: illegal address, sticky), whether the multicast set-up failed
        # (S1) or the GPUs never had multicast (attr 132 = 0: no set-up at all, MC6b).
        unchecked = self.params.get("symm_multimem_unchecked") and not self.mc
        if op in ("all_reduce", "all_reduce_rmsnorm") and (self.mc or unchecked):
            dtype = str(x.dtype).removeprefix("torch.")
            nbytes = x.numel() * x.element_size()
            self._stage(x)
            self.round += 1
            check("multimem_all_reduce", self.driver.launch_kernel(
                K.multimem_all_reduce, self.mc, self.ptrs[self.rank], self.rank, self.ws,
                x.numel(), dtype, self.capacity, self.round))
            return self._result(nbytes, x, tuple(x.shape))
        return super().run(op, x)

    # -- close -----------------------------------------------------------------------------
    def close(self) -> None:
        """Row G8: sync, barrier, unbind, unmap multicast, unmap peers, release multicast,
        release imports and own, free the VA ranges."""
        if self.closed:
            return
        self.closed = True
        d = self.driver
        d.cudaDeviceSynchronize()
        self.close_barrier("symm.close: all ranks done with peer memory")
        if self.own_fd is not None:       # set-up stopped between export and rendezvous
            d.close_fd(self.own_fd)
            self.own_fd = None
        self._unbind_unmap_multicast()
        self.unmap_peers()
        if self.mc_handle:
            d.cuMemRelease(self.mc_handle)
            self.mc_handle = 0
        self.release_peers()
