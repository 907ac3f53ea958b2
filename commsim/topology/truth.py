"""Ground truth about sharing memory, from the topology alone.

Which handle types the process on one GPU can import from the process on another, restated
from the documented rules (rows L5-L10, V2-V9, F1-F4), and the facts about one
group of GPUs that a backend's oracle rule (`Backend.truth`) reads. Nothing here looks at a
driver or a discovery view: a wrong rule in a backend's `eligibility` shows up as a
disagreement with this, instead of being agreed with.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

from commsim.topology.model import Cluster, FabricState, GpuRef, ZERO_UUID

# Handle types a rank may import from another.
IPC, POSIX_FD, FABRIC = "ipc", "posix_fd", "fabric"


def fabric_ready(cluster: Cluster, ref: GpuRef) -> bool:
    """NCCL's / TRT-LLM's MNNVL test on one GPU (rows F1, F2, F4) plus the device attributes
    FABRIC memory needs (rows V2, V4) and active NVLinks (as FlashInfer / TRT-LLM check)."""
    g = cluster.gpu(ref)
    f = g.fabric
    return (g.vmm and g.fabric_handle and f.state == FabricState.COMPLETED and f.status == 0
            and f.cluster_uuid != ZERO_UUID and g.nvlinks_up)


def nvlink_p2p(cluster: Cluster, a: GpuRef, b: GpuRef) -> bool:
    """Same host, and the pair is NVLink-connected with its links up (what NVML's NVLink P2P
    status reports, rows N1/N2 of docs/fidelity-rules.md: true to the links whatever the P2P
    fact says), or the same GPU."""
    if a.host != b.host:
        return False
    if a.index == b.index:
        return True
    lk = cluster.host(a.host).link(a.index, b.index)
    return lk.is_nvlink and cluster.gpu(a).nvlinks_up and cluster.gpu(b).nvlinks_up


def p2p_unreal(cluster: Cluster, a: GpuRef, b: GpuRef) -> bool:
    """P2P reported between two GPUs of one host that the functional probe disproves: the
    IPC open is refused or writes do not arrive intact (rows P1-P4)."""
    if a == b or a.host != b.host:
        return False
    lk = cluster.host(a.host).link(a.index, b.index)
    return lk.p2p and not lk.p2p_real


def fabric_path_disproved(cluster: Cluster, a: GpuRef, b: GpuRef) -> bool:
    """P2P disproved between two GPUs of one host as a library that trusts the functional
    probe over cuDeviceCanAccessPeer sees it, for the same-host FABRIC path (rows P1-P4).
    Where the rank cannot ask cuDeviceCanAccessPeer about the peer (one GPU per process,
    row W1) the probe is the P2P fact: a refused open (P1, P2) reads as no P2P (row L10),
    under which FABRIC mappings stay legal, and only bytes lost through an open that worked
    (P3) disprove the path. Between containers (row W6) no probe runs: P1/P2 leave the path
    sound; P3 still breaks it (the sampler does not draw that, fidelity_faults.unjudgeable)."""
    if not p2p_unreal(cluster, a, b):
        return False
    host = cluster.host(a.host)
    if host.container.one_gpu_per_process or host.gpu_namespace(a.index) != host.gpu_namespace(b.index):
        return bool(host.link(a.index, b.index).lost_writes)
    return True


def importable(cluster: Cluster, a: GpuRef, b: GpuRef) -> frozenset[str]:
    """The handle types the process on GPU `a` can import from the process on GPU `b`."""
    out = set()
    same_host = a.host == b.host
    # Legacy IPC: host-local (row L8), and the importer needs P2P to the exporter (row L10).
    # An open refused although P2P is reported (rows P1, P2) is no import either.
    lk = cluster.host(a.host).link(a.index, b.index) if same_host and a.index != b.index else None
    ns_a, ns_b = cluster.host(a.host).gpu_namespace(a.index), cluster.host(b.host).gpu_namespace(b.index)
    # ... and one pid / IPC namespace: not between containers of one host (row W6).
    if same_host and ns_a == ns_b and (lk is None or (lk.p2p and not lk.ipc_refused)):
        out.add(IPC)
    # POSIX fd: travels over AF_UNIX, so one shm / socket namespace (rows V9, W6).
    ga, gb = cluster.gpu(a), cluster.gpu(b)
    if (ns_a == ns_b and ga.vmm and gb.vmm and ga.posix_fd and gb.posix_fd):
        out.add(POSIX_FD)
    # FABRIC: both MNNVL-ready, one IMEX channel in common (rows V3, V5), one domain (V7).
    ha, hb = cluster.host(a.host), cluster.host(b.host)
    if (fabric_ready(cluster, a) and fabric_ready(cluster, b)
            and set(ha.usable_imex_channels) & set(hb.usable_imex_channels)
            and cluster.same_domain(a, b)
            and ga.fabric.cluster_uuid == gb.fabric.cluster_uuid):
        out.add(FABRIC)
    return frozenset(out)


# GroupFacts.of's memo: (id(cluster), gpus) -> facts, least recently used first. Groups above
# FACTS_KEPT_UP_TO GPUs are not kept (a 576-rank group's pair table is large, and asked once).
_FACTS: "OrderedDict[tuple[int, tuple[GpuRef, ...]], GroupFacts]" = OrderedDict()
FACTS_KEPT = 4096
FACTS_KEPT_UP_TO = 32


@dataclass(frozen=True)
class GroupFacts:
    """One group's GPUs and what the topology says about every ordered pair of them."""

    cluster: Cluster
    gpus: tuple[GpuRef, ...]
    pairs: tuple[tuple[GpuRef, GpuRef], ...]
    imp: dict[tuple[GpuRef, GpuRef], frozenset[str]]
    nvl_all: bool               # every pair NVLink-connected, links up, on one host
    single_host: bool
    p2p_all: bool = True        # every pair reports P2P (cuDeviceCanAccessPeer)
    # The first pair whose reported P2P the functional probe disproves (rows P1-P4), or None.
    unreal: tuple[GpuRef, GpuRef] | None = None
    # The first pair whose disproof rules out the same-host FABRIC path (fabric_path_disproved).
    fabric_unreal: tuple[GpuRef, GpuRef] | None = None
    # Why set-ups no query can foresee must fail (docs/fidelity-rules.md): "" when none.
    caps_missing: str = ""      # a container without /dev/nvidia-caps (row MC3)
    imex_split: str = ""        # two hosts in different IMEX domains (row I3)

    @classmethod
    def of(cls, cluster: Cluster, gpus: tuple[GpuRef, ...]) -> "GroupFacts":
        """The facts, kept per (cluster object, GPUs) for small groups: both are immutable, a
        preset cluster is built once per machine shape, and a sweep asks about the same
        groups of the same shapes again and again (twice per scenario, by the oracle)."""
        key = (id(cluster), gpus)
        got = _FACTS.get(key)
        if got is not None and got.cluster is cluster:   # the held cluster keeps its id
            _FACTS.move_to_end(key)
            return got
        got = cls._of(cluster, gpus)
        if len(gpus) <= FACTS_KEPT_UP_TO:
            _FACTS[key] = got
            while len(_FACTS) > FACTS_KEPT:
                _FACTS.popitem(last=False)
        return got

    @classmethod
    def _of(cls, cluster: Cluster, gpus: tuple[GpuRef, ...]) -> "GroupFacts":
        pairs = tuple((a, b) for i, a in enumerate(gpus) for j, b in enumerate(gpus) if i != j)
        caps = next((g.host for g in gpus if not cluster.host(g.host).container.nvidia_caps), None)
        split = next(((a, b) for a, b in pairs if not cluster.same_imex_domain(a.host, b.host)), None)
        unreal = next(((a, b) for a, b in pairs if p2p_unreal(cluster, a, b)), None)
        return cls(cluster, gpus, pairs, {(a, b): importable(cluster, a, b) for a, b in pairs},
                   all(nvlink_p2p(cluster, a, b) for a, b in pairs),
                   len({g.host for g in gpus}) == 1,
                   all(cluster.p2p(a, b) for a, b in pairs),
                   unreal,
                   # a subset of the unreal pairs: only scanned when there is one
                   next(((a, b) for a, b in pairs if fabric_path_disproved(cluster, a, b)), None)
                   if unreal else None,
                   f"host {caps} runs in a container without /dev/nvidia-caps (row MC3)" if caps else "",
                   (f"{split[0].host} and {split[1].host} are in different IMEX domains (row I3)"
                    if split else ""))

    @property
    def ws(self) -> int:
        return len(self.gpus)

    def first_pair_without(self, handle: str) -> tuple[GpuRef, GpuRef] | None:
        """The first ordered pair whose importer cannot import `handle` from the exporter."""
        return next(((a, b) for a, b in self.pairs if handle not in self.imp[(a, b)]), None)

    def all_pairs_import(self, handle: str) -> bool:
        return self.first_pair_without(handle) is None

    @property
    def one_shm_namespace(self) -> bool:
        return len({self.cluster.host(g.host).gpu_namespace(g.index) for g in self.gpus}) == 1
