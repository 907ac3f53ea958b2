"""Discovery: what each rank can learn about itself through the Driver, shared over the group.

A rank knows only what a real process can: its host name and shm
namespace, device attributes, NVML fabric info and NVLink state, IMEX channel presence, and
`cuDeviceCanAccessPeer` towards the GPUs of its own host. One all-gather gives every rank the
same `GroupView`, so every rank reaches the same decision before any handle exchange: a
rank-local probe that disagrees cannot split the group.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Callable, Hashable, Iterable, TypeVar

from cuda.bindings import driver as cu

from commsim.driver import Driver, NVML_P2P_STATUS_OK, PROBE_WRITES_LOST, check
from commsim.topology.model import FabricState

A = cu.CUdevice_attribute
T = TypeVar("T")

# Why a same-host group whose ranks see different /dev/shm cannot share host-local handles
# (row W6: a container per process, as Docker gives without --ipc=host / --pid=host).
CONTAINERS = ("ranks on one host are in different containers (own /dev/shm, pid and IPC "
              "namespaces; row W6): legacy IPC opens and POSIX fds do not cross them")


@dataclass(frozen=True)
class RankInfo:
    rank: int
    host: str
    shm_namespace: str
    device: int                     # CUDA ordinal in its process (= NVML index here)
    sm: int
    vmm: bool
    posix_fd: bool
    fabric_handle: bool
    multicast: bool
    imex: bool
    fabric_uuid: bytes
    fabric_clique: int
    fabric_state: int
    fabric_status: int
    nvlinks_up: bool
    # over the GPUs of this rank's host, by NVML index: P2P allowed (None: not visible to this
    # process, so not askable) / NVLink P2P status OK
    p2p: tuple[bool | None, ...]
    nvlink: tuple[bool, ...]
    # The functional probe towards each GPU the rank reports P2P to (row P4): "" = the IPC
    # round trip kept its bytes, text = what failed, None = not probed / probe unavailable.
    p2p_probe: tuple[str | None, ...] = ()
    gpu_index: int = -1             # NVML index on its host (-1: same as `device`)

    @property
    def gpu(self) -> int:
        return self.device if self.gpu_index < 0 else self.gpu_index

    def can_access(self, other: "RankInfo") -> bool:
        """P2P towards `other` (same host) as this rank knows it: cuDeviceCanAccessPeer where
        the peer is visible; where it is not (row W1), the functional probe's verdict."""
        if other.host != self.host:
            return False
        k = other.gpu
        known = self.p2p[k] if k < len(self.p2p) else None
        if known is None:
            why = self.p2p_probe[k] if k < len(self.p2p_probe) else None
            return why == ""
        return known

    @property
    def mnnvl_capable(self) -> bool:
        """NCCL's local MNNVL test (ncclMnnvlCheck): fabric attribute, state
        COMPLETED with success status, non-zero cluster UUID, IMEX channel present."""
        return (self.fabric_handle and self.vmm and self.imex and any(self.fabric_uuid)
                and self.fabric_state == FabricState.COMPLETED and self.fabric_status == 0)


def _nvml_index(driver: Driver, ordinal: int) -> int:
    """The NVML index (host-wide, not remapped by CUDA_VISIBLE_DEVICES) of a CUDA ordinal; a
    driver that cannot say is taken to see every GPU in NVML order (row W1)."""
    f = getattr(driver, "nvml_index", None)
    return ordinal if f is None else f(ordinal)


def probe(driver: Driver, rank: int) -> RankInfo:
    """The rank-local probe. Uses only Driver calls.

    Per-GPU facts are indexed by NVML index over every GPU of the host: CUDA ordinals are
    remapped per process by CUDA_VISIBLE_DEVICES (row W1), so a process that sees one GPU
    cannot ask cuDeviceCanAccessPeer about the others (None there) and relies on NVML and on
    the functional probe, which runs in helper processes of its own (row W2)."""
    dev = check("cudaGetDevice", driver.cudaGetDevice())

    def attr(a) -> int:
        return check("cuDeviceGetAttribute", driver.cuDeviceGetAttribute(a, dev))

    def newer_attr(a) -> int:
        # an attribute the host's driver may predate (multicast's before branch 530, row M9):
        # CUDA_ERROR_INVALID_VALUE there, read as "not supported"
        err, v = driver.cuDeviceGetAttribute(a, dev)
        return int(v) if int(err) == 0 else 0

    n = check("cudaGetDeviceCount", driver.cudaGetDeviceCount())
    me = _nvml_index(driver, dev)
    count = getattr(driver, "nvmlDeviceGetCount", None)
    nvml_count = count()[1] if count is not None else n
    # Facts are kept by host index (what a PCI bus id names): under a container's device
    # cgroup NVML numbers only the container's GPUs (row W3), and a GPU outside it is
    # neither askable nor probeable from here (None).
    host_of = getattr(driver, "nvml_host_index", None)
    host_index = [j if host_of is None else host_of(j) for j in range(nvml_count)]
    slots = getattr(driver, "host_gpu_count", None)
    width = max(max(host_index, default=-1) + 1, slots() if slots is not None else 0)
    ordinal_of = {_nvml_index(driver, o): o for o in range(n)}
    at = {k: j for j, k in enumerate(host_index)}        # host index -> NVML index
    p2p = tuple(None if k not in at else True if at[k] == me else
                (bool(check("cuDeviceCanAccessPeer", driver.cuDeviceCanAccessPeer(dev, ordinal_of[at[k]])))
                 if at[k] in ordinal_of else None)
                for k in range(width))
    nvl = []
    for k in range(width):
        err, status = driver.nvmlDeviceGetP2PStatus(me, at[k]) if k in at else (2, None)
        nvl.append(err == 0 and status == NVML_P2P_STATUS_OK)   # any NVML error: not connected
    # What serving stacks do before trusting the flag (vLLM gpu_p2p_access_check): a real IPC
    # round trip with a check of the bytes, in helper processes, towards every peer the
    # driver reports P2P to (or cannot be asked about). A driver without the capability
    # leaves it None (the flag is trusted); a GPU outside the container cannot be probed.
    run_probe = getattr(driver, "p2p_probe", None)
    probed = tuple(run_probe(me, at[k]) if run_probe is not None and k in at and at[k] != me
                   and p2p[k] is not False else None for k in range(width))
    err, fab = driver.nvmlDeviceGetGpuFabricInfo(me)
    err2, links_up = driver.nvmlDeviceGetNvLinkState(me)
    major = attr(A.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)
    minor = attr(A.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)
    return RankInfo(
        rank=rank, host=driver.gethostname(), shm_namespace=driver.shm_namespace(), device=dev,
        sm=major * 10 + minor,
        vmm=bool(attr(A.CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED)),
        posix_fd=bool(attr(A.CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED)),
        fabric_handle=bool(attr(A.CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_FABRIC_SUPPORTED)),
        multicast=bool(newer_attr(A.CU_DEVICE_ATTRIBUTE_MULTICAST_SUPPORTED)),
        imex=bool(driver.imex_channels()),
        fabric_uuid=fab.cluster_uuid if err == 0 else bytes(16),
        fabric_clique=fab.clique_id if err == 0 else 0,
        fabric_state=fab.state if err == 0 else 0,
        fabric_status=fab.status if err == 0 else -1,
        nvlinks_up=bool(links_up) if err2 == 0 else False,
        p2p=p2p, nvlink=tuple(nvl), p2p_probe=probed, gpu_index=host_index[me] if host_index else me)


@dataclass(frozen=True)
class GroupView:
    """Everything every rank knows about the group after discovery (identical on all ranks)."""

    ranks: tuple[RankInfo, ...]

    @classmethod
    def of(cls, ranks: Iterable[RankInfo]) -> "GroupView":
        """The view of these RankInfos, one per group: an in-process all-gather hands every
        rank the same RankInfo objects (immutable, so shared: commsim/group/sharing.py), and
        the ranks then share one view, whose derived facts (pair scans, eligibility, NCCL's
        decision) are pure functions of those objects, computed once instead of once per
        rank. Found by the RankInfos' identities; the table holds its views, so an id stays
        its object's while its entry lives, and forgets the oldest past _VIEWS_KEPT."""
        ranks = tuple(ranks)
        key = tuple(map(id, ranks))
        view = _views.get(key)
        if view is not None and view.ranks == ranks:
            return view
        view = _views[key] = cls(ranks)
        if len(_views) > _VIEWS_KEPT:
            del _views[next(iter(_views))]
        return view

    def derived(self, key: Hashable, compute: Callable[[], T]) -> T:
        """`compute()` once per view and `key`, for facts that are a pure function of the view
        (and of what `key` names): every rank's communicator asks for the same ones."""
        memo = self.__dict__.get("_derived")
        if memo is None:
            memo = self.__dict__["_derived"] = {}     # like cached_property: not a field
        if key in memo:
            return memo[key]
        value = memo[key] = compute()
        return value

    @property
    def size(self) -> int:
        return len(self.ranks)

    # The derived facts below are computed once per view (cached_property writes the
    # instance dict, not a field: the view stays frozen): every backend's eligibility asks,
    # symm asks again for its own and multicast's, and the pair scans are O(ranks^2).
    @functools.cached_property
    def hosts(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(r.host for r in self.ranks))

    @property
    def single_host(self) -> bool:
        return len(self.hosts) == 1

    @functools.cached_property
    def same_shm(self) -> bool:
        """vLLM's `in_the_same_node_as`: one POSIX shm namespace."""
        return len({r.shm_namespace for r in self.ranks}) == 1

    def pairs(self):
        for a in self.ranks:
            for b in self.ranks:
                if a.rank != b.rank:
                    yield a, b

    def host_pairs(self):
        """The pairs of `pairs()` that share a host, in the same order: O(ranks x ranks per
        host), not O(ranks^2) (a 576-rank group spans 144 hosts)."""
        by_host: dict[str, list[RankInfo]] = {}
        for r in self.ranks:
            by_host.setdefault(r.host, []).append(r)
        for a in self.ranks:
            for b in by_host[a.host]:
                if a.rank != b.rank:
                    yield a, b

    def p2p_all(self) -> bool:
        return self._p2p_all

    @functools.cached_property
    def _p2p_all(self) -> bool:
        return all(a.can_access(b) for a, b in self.pairs())

    def p2p_unreal(self) -> str:
        """The first pair whose reported P2P (cuDeviceCanAccessPeer = 1) the functional probe
        disproved (rows P1-P4), as a sentence; "" when none did. Where the peer is not
        visible (row W1) the probe is the P2P fact itself (`can_access`), not a disproof,
        unless its open worked and the bytes came back wrong (row P3).
        Computed once per view: every backend's eligibility asks."""
        return self._unreal

    @functools.cached_property
    def _unreal(self) -> str:
        if not any(any(r.p2p_probe) for r in self.ranks):
            return ""           # no probe failed anywhere (the usual case): no pair to scan
        for a, b in self.host_pairs():
            if b.gpu >= len(a.p2p_probe) or a.p2p[b.gpu] is False:
                continue        # not reported
            if a.shm_namespace != b.shm_namespace:
                continue        # other containers: the IPC open fails on namespaces (row W6), not P2P
            why = a.p2p_probe[b.gpu]
            if a.p2p[b.gpu] is None and not (why and why.endswith(PROBE_WRITES_LOST)):
                # Not askable (row W1): the probe is the P2P fact itself (`can_access`), and
                # an open it saw refused reads as no P2P (row L10), not a disproof. Bytes that
                # came back wrong through an open that worked do disprove it (row P3): the
                # same-host FABRIC mappings would ride that path (sweep s12-1190, s12-7424).
                continue
            if why:
                return (f"functional P2P probe, rank {a.rank} -> rank {b.rank}: {why}; the probe is "
                        f"trusted over cuDeviceCanAccessPeer")
        return ""

    def nvlink_all(self) -> bool:
        """vLLM `is_fully_connected`: NVML NVLink P2P status OK for every pair (custom_all_reduce.py)."""
        return self._nvlink_all

    @functools.cached_property
    def _nvlink_all(self) -> bool:
        return all(a.host == b.host and a.nvlink[b.gpu] for a, b in self.pairs())

    def same_fabric_domain(self) -> bool:
        """NCCL's domain test: one non-zero cluster UUID over the group (src/mnnvl.cc)."""
        return self._same_fabric_domain

    @functools.cached_property
    def _same_fabric_domain(self) -> bool:
        uuids = {r.fabric_uuid for r in self.ranks}
        return len(uuids) == 1 and any(next(iter(uuids)))

    def first(self, pred) -> RankInfo | None:
        for r in self.ranks:
            if pred(r):
                return r
        return None


_views: dict[tuple[int, ...], GroupView] = {}     # GroupView.of, by the RankInfos' ids
_VIEWS_KEPT = 16


def discover(driver: Driver, group, tag: str = "discover") -> GroupView:
    """Probe locally, then all-gather: the one exchange before any decision."""
    info = probe(driver, group.rank)
    return GroupView.of(group.all_gather_object(info, tag=f"{tag}: all-gather rank info"))
