"""Cost model: alpha-beta estimates of all-reduce time per backend and algorithm.

    time = alpha (fixed cost of the kernel: launch, flag exchanges, first-byte latency)
         + bytes crossing the busiest GPU port / (efficiency x link bandwidth)

The bandwidth term counts what each algorithm moves through one GPU's port, for p ranks and an
n-byte message: one-shot reads the whole message from every peer, (p-1)n; two-shot is a
reduce-scatter plus an all-gather of n/p slices, 2(p-1)n/p; a ring moves 2(p-1)n/p in 2(p-1)
steps; multicast (NVLS / multimem) lets the switch reduce and replicate, about n per port.
On direct NVLink meshes (no switch) every peer has its own link, so the per-peer share counts.

Every number lives in PARAMS below with its source. Figures that are not published as such
are marked `estimate=True` and say how they were derived. The model knows the topology only
through a `GroupFabric`, built from the simulator's ground truth (`group_fabric`) or, as a
communicator would, from its discovery view (`fabric_from_view`).

How a policy uses it: the "model" preset (`commsim.policy.ModelPolicy`) binds to the group
after discovery and tries backends in `ordered_by_model(order, nbytes, fabric_from_view(view))`;
each backend's `accepts` limits still apply in that order. The default policy's fixed order
does not use the model.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Callable, Iterable, Sequence

from commsim.topology.model import Cluster, FabricState, GpuRef

if TYPE_CHECKING:   # the model stays importable without the driver bindings discovery needs
    from commsim.discovery import GroupView

KiB, MiB, GiB = 1 << 10, 1 << 20, 1 << 30
US = 1e-6


@dataclass(frozen=True)
class Param:
    value: float
    unit: str
    source: str
    estimate: bool = False      # True: derived, not published as such; `source` says how


# NCCL's own tuning model, NVIDIA/nccl src/graph/tuning.cc at b6475625 (baseLat, hwLat): the
# latency NCCL itself assumes per algorithm, protocol and hardware hop.
_NCCL = "NVIDIA/nccl src/graph/tuning.cc@b6475625"
_VLLM_24111 = ("vllm-project/vllm#24111 (H100 benchmark tables: ca_1stage, ca_2stage, "
               "symm_mem_multimem at TP 4 and 6)")
_VLLM_42324 = ("vllm-project/vllm#42324 (the last SM 9.0 / H100 table: pynccl and "
               "symm_mem_multimem, 512 KiB-128 MiB; its world-size heading was not in the "
               "excerpt read)")

PARAMS: dict[str, Param] = {
    # -- link bandwidth per GPU and direction ------------------------------------------------
    "nvlink2.link": Param(25.0, "GB/s", "V100: 6 NVLink-2 links, 300 GB/s total both ways "
                                        "(NVIDIA Tesla V100 datasheet)"),
    "nvlink3.link": Param(25.0, "GB/s", "A100: 12 NVLink-3 links, 600 GB/s total both ways "
                                        "(NVIDIA A100 datasheet; also the A100 PCIe bridge)"),
    "nvlink4.link": Param(25.0, "GB/s", "H100 SXM: 18 NVLink-4 links, 900 GB/s total both ways "
                                        "(NVIDIA H100 datasheet)"),
    "nvlink5.link": Param(50.0, "GB/s", "B200/GB200: 18 NVLink-5 links, 1.8 TB/s total both "
                                        "ways (NVIDIA GB200 NVL72 page)"),
    "pcie3.x16": Param(15.75, "GB/s", "PCIe 3.0 x16: 8 GT/s x 16 lanes, 128b/130b (PCI-SIG)"),
    "pcie4.x16": Param(31.5, "GB/s", "PCIe 4.0 x16: 16 GT/s x 16 lanes, 128b/130b (PCI-SIG)"),
    "pcie5.x16": Param(63.0, "GB/s", "PCIe 5.0 x16: 32 GT/s x 16 lanes, 128b/130b (PCI-SIG)"),
    "nic.ndr": Param(50.0, "GB/s", "InfiniBand NDR / 400 GbE: 400 Gb/s per port (NVIDIA "
                                   "ConnectX-7 and Quantum-2 product pages)"),
    "nics_per_gpu": Param(1.0, "", "one 400G NIC per GPU, the rail-optimised HGX layout (e.g. "
                                   "Azure NDv5: 8 NDR NICs for 8 GPUs, its published NCCL "
                                   "topology file)", estimate=True),
    # -- achieved fraction of link bandwidth ---------------------------------------------------
    "eff.peer": Param(0.8, "", f"one-shot slopes in {_VLLM_24111}: ca_1stage 8 us/MiB at TP4 "
                               f"(0.87 of 450 GB/s), 16 us/MiB at TP6 (0.73); nccl-tests 230-250 "
                               f"GB/s bus bandwidth on 8xA100 (0.77-0.83 of 300 GB/s, "
                               f"docs.alayanew.com NCCL-tests reference table)", estimate=True),
    # Two-shot reads n/p slices from every peer twice with a grid barrier in between; the
    # vLLM kernel reaches less of the link than one-shot does.
    "eff.peer_two_shot": Param(0.55, "", f"ca_2stage slopes in {_VLLM_24111}, least squares "
                                         f"over 0.5-4 MiB: 7.5 us/MiB at TP4 (1.5 MiB per port: "
                                         f"0.46 of 450 GB/s), 6.3 us/MiB at TP6 (1.67 MiB: 0.62); "
                                         f"their mean", estimate=True),
    "eff.ring": Param(0.8, "", "nccl-tests all_reduce on 8xA100: 230-250 GB/s bus bandwidth of "
                               "the 300 GB/s link (docs.alayanew.com NCCL-tests reference "
                               "table)", estimate=True),
    # Switch-reduced all-reduce. The torch symm-mem multimem kernel keeps one slope at every
    # size; NCCL's NVLS is slower than it up to tens of MiB and faster beyond (it adds
    # channels as messages grow), so NVLS gets two slopes and a knee.
    "eff.multimem": Param(0.47, "", f"torch symm-mem multimem slopes: least squares over 0.5-4 "
                                    f"MiB in {_VLLM_24111}, 4.9 us/MiB at TP4 and 5.0 at TP6 "
                                    f"(0.47 of 450 GB/s); 4.9 us/MiB over 16-64 MiB in "
                                    f"{_VLLM_42324} (0.48)", estimate=True),
    "eff.nvls": Param(0.42, "", f"NCCL NVLS below the knee: pynccl slopes, least squares over "
                                f"0.5-4 MiB at TP4 in {_VLLM_24111}, 5.8 us/MiB (0.40 of 450 "
                                f"GB/s); 5.6 us/MiB over 8-16 MiB in {_VLLM_42324} (0.42)",
                      estimate=True),
    "eff.nvls.large": Param(0.6, "", f"NCCL NVLS above the knee: pynccl 3.8 us/MiB over 32-128 "
                                     f"MiB in {_VLLM_42324} (0.61 of 450 GB/s); nccl-tests on "
                                     f"8xH100 with NVLS, 460-480 GB/s bus bandwidth (0.6; "
                                     f"docs.alayanew.com NCCL-tests reference table)",
                            estimate=True),
    "nvls.knee": Param(32.0, "MiB", f"where the pynccl slope in {_VLLM_42324} turns: 5.6 us/MiB "
                                    f"at 8-16 MiB, 4.6 at 16-32 MiB, 3.8 from 32 MiB on",
                       estimate=True),
    # -- fixed costs ---------------------------------------------------------------------------
    "alpha.peer_one_shot": Param(6.0, "us", f"least-squares intercept of ca_1stage over 0.5-4 "
                                            f"MiB in {_VLLM_24111}: 6.7 us at TP4, 5.2 us at TP6",
                                 estimate=True),
    # Two-shot's fixed cost over one-shot (one more grid barrier and peer flag round) depends
    # on the GPU generation: one knob per generation. Generations without their own value
    # (Volta, Blackwell) take Hopper's.
    "alpha.peer_two_shot.sm90": Param(12.0, "us", f"least-squares intercept of ca_2stage over "
                                                  f"0.5-4 MiB in {_VLLM_24111}: 12.8 us at TP4, "
                                                  f"11.4 us at TP6 (ca_1stage: 6.7 and 5.2)",
                                      estimate=True),
    "alpha.peer_two_shot.sm80": Param(9.0, "us", "fitted to vLLM's 1-stage/2-stage cut-offs "
                                                 "(csrc/custom_all_reduce.cuh: ws<=4 below 512 "
                                                 "KiB, ws<=8 below 256 KiB), which were tuned on "
                                                 "A100-80G (vllm-project/vllm#2192)",
                                      estimate=True),
    "alpha.multimem": Param(13.0, "us", f"least-squares intercept of symm_mem_multimem over "
                                        f"0.5-4 MiB in {_VLLM_24111}: 13.4 us at TP4 (10.7 at "
                                        f"TP6)",
                            estimate=True),
    "alpha.lamport_one_shot": Param(6.0, "us", "MNNVL one-shot (Lamport flags in the data, no "
                                               "barrier): taken equal to the peer one-shot",
                                    estimate=True),
    "alpha.lamport_two_shot_extra": Param(0.9, "us", "fitted to FlashInfer's MNNVL one-shot "
                                                     "cut-off tokens*hidden*tp*elem <= 1 MiB "
                                                     "(trtllm_mnnvl_ar.py@fb28d72, set on GB200 "
                                                     "NVL72 at tp 8): the second Lamport phase's "
                                                     "flag round over the NVLink switch",
                                          estimate=True),
    "nccl.base.LL": Param(6.6, "us", f"ring LL baseLat, {_NCCL}"),
    "nccl.base.LL128": Param(14.0, "us", f"ring LL128 baseLat, {_NCCL}"),
    "nccl.base.Simple": Param(8.4, "us", f"ring Simple baseLat, {_NCCL}"),
    "nccl.hop.nvlink.LL": Param(0.6, "us", f"ring LL hwLat NVLink per step, {_NCCL}"),
    "nccl.hop.nvlink.LL128": Param(1.9, "us", f"ring LL128 hwLat NVLink, {_NCCL}"),
    "nccl.hop.nvlink.Simple": Param(3.4, "us", f"ring Simple hwLat NVLink, {_NCCL}"),
    "nccl.hop.pcie.LL": Param(1.0, "us", f"ring LL hwLat PCI, {_NCCL}"),
    "nccl.hop.pcie.LL128": Param(2.5, "us", f"ring LL128 hwLat PCI, {_NCCL}"),
    "nccl.hop.pcie.Simple": Param(5.7, "us", f"ring Simple hwLat PCI, {_NCCL}"),
    "nccl.hop.net.LL": Param(2.7, "us", f"ring LL hwLat NET, {_NCCL}"),
    "nccl.hop.net.LL128": Param(4.0, "us", f"ring LL128 hwLat NET, {_NCCL}"),
    "nccl.hop.net.Simple": Param(14.0, "us", f"ring Simple hwLat NET, {_NCCL}"),
    "nccl.nvls": Param(23.0, "us", f"NVLS Simple hwLat NVLink (single node), {_NCCL}"),
    "nccl.bw.LL": Param(0.25, "", f"ring LL all-reduce bus bandwidth factor 1/4, {_NCCL}"),
    "nccl.bw.LL128": Param(0.92, "", f"ring LL128 bus bandwidth factor 120/128, {_NCCL}"),
    "nccl.bw.Simple": Param(1.0, "", f"ring Simple: full bus bandwidth, {_NCCL}"),
}

_PROTOCOLS = ("LL", "LL128", "Simple")
# NVLink generation and PCIe generation by compute-capability major.
_NVLINK_GEN = {7: 2, 8: 3, 9: 4, 10: 5}
_NVLINKS_PER_GPU = {2: 6, 3: 12, 4: 18, 5: 18}
_PCIE_GEN = {7: 3, 8: 4, 9: 5, 10: 5, 12: 5}

def backend_algorithms() -> dict[str, tuple[str, ...]]:
    """The algorithms the model predicts, per registered backend that names a cost family
    (each backend declares both, commsim/backends/registry.py)."""
    from commsim.backends import backends
    return {n: c.algorithms for n, c in backends().items() if c.cost_family is not None}


def cost_family(backend: str) -> str | None:
    from commsim.backends import get_backend
    cls = get_backend(backend)
    return None if cls is None else cls.cost_family


def _p(name: str) -> float:
    return PARAMS[name].value


def nvlink_gbps(sm: int, links: int | None = None) -> float:
    """Per-direction NVLink bandwidth of a GPU (all its links, or `links` of them)."""
    gen = _NVLINK_GEN.get(sm // 10)
    if gen is None:
        return 0.0
    n = _NVLINKS_PER_GPU[gen] if links is None else links
    return n * _p(f"nvlink{gen}.link")


def pcie_gbps(sm: int) -> float:
    return _p(f"pcie{_PCIE_GEN.get(sm // 10, 4)}.x16")


# -- what the model knows about a group ------------------------------------------------------


@dataclass(frozen=True)
class GroupFabric:
    """The interconnect of one group as the model sees it."""

    ranks: int
    hosts: int
    sm: int                  # lowest compute capability in the group, e.g. 90
    path: str                # self | nvswitch | mnnvl | nvlink (direct links) | pcie | net
    link_gbps: float         # per-GPU, per-direction bandwidth among GPUs that share a host/domain
    aggregate: bool          # one port carries every peer's traffic (switch, PCIe) vs a link each
    multicast: bool          # every rank can join one multicast object (NVSwitch domain)
    nic_gbps: float = 0.0    # per GPU between hosts (path "net")
    # NCCL's own NVLS eligibility (commsim/libmodels/nccl_rules.py: cuMem, NCCL_NVLS_ENABLE, GPUs per
    # node), when known; None: NCCL may use NVLS wherever multicast is possible.
    nccl_nvls: bool | None = None

    @property
    def hop(self) -> str:
        """NCCL's hardware class for one step: nvlink, pcie or net."""
        return {"net": "net", "pcie": "pcie"}.get(self.path, "nvlink")

    def describe(self) -> str:
        what = {"self": "one rank", "nvswitch": "NVSwitch", "mnnvl": "multi-node NVLink",
                "nvlink": "direct NVLink", "pcie": "PCIe", "net": "network"}[self.path]
        text = (f"{self.ranks} ranks on {self.hosts} host(s), {what}, sm {self.sm}, "
                f"{self.link_gbps:g} GB/s per GPU per direction")
        if self.path == "net":
            text += f", {self.nic_gbps:g} GB/s network per GPU"
        return text + (", multicast" if self.multicast else "")


def _intra_host(cluster: Cluster, refs: Sequence[GpuRef], sm: int) -> tuple[str, float, bool]:
    """(path, GB/s, aggregate) among the given GPUs of one host."""
    if len(refs) < 2:
        return "self", nvlink_gbps(sm) or pcie_gbps(sm), True
    host = cluster.host(refs[0].host)
    links = [host.link(a.index, b.index) for a in refs for b in refs if a.index < b.index]
    if all(lk.is_nvlink for lk in links):
        return "nvlink", nvlink_gbps(sm, min(lk.nvlinks for lk in links)), False
    return "pcie", pcie_gbps(sm), True


def group_fabric(cluster: Cluster, placement: Sequence[GpuRef],
                 nic_gbps: float | None = None) -> GroupFabric:
    """The model's view of the GPUs in `placement`, from the topology (ground truth)."""
    refs = list(placement)
    if not refs:
        raise ValueError("placement is empty")
    p = len(refs)
    hosts = list(dict.fromkeys(r.host for r in refs))
    sm = min(cluster.gpu(r).sm for r in refs)
    nic = nic_gbps if nic_gbps is not None else _p("nic.ndr") * _p("nics_per_gpu")
    if p == 1:
        return GroupFabric(1, 1, sm, "self", nvlink_gbps(sm) or pcie_gbps(sm), True, False)
    domains = {id(cluster.domain_of(r)) if cluster.domain_of(r) else None for r in refs}
    multicast = all(cluster.gpu(r).multicast for r in refs)
    if len(domains) == 1 and None not in domains:
        path = "nvswitch" if len(hosts) == 1 else "mnnvl"
        return GroupFabric(p, len(hosts), sm, path, nvlink_gbps(sm), True, multicast)
    per_host = [_intra_host(cluster, [r for r in refs if r.host == h], sm) for h in hosts]
    if len(hosts) == 1:
        path, gbps, agg = per_host[0]
        return GroupFabric(p, 1, sm, path, gbps, agg, False)
    gbps = min(g for _, g, _ in per_host)
    return GroupFabric(p, len(hosts), sm, "net", gbps, all(a for _, _, a in per_host), False, nic)


def fabric_from_view(view: "GroupView", nic_gbps: float | None = None) -> GroupFabric:
    """The same from a discovery `GroupView`: what a communicator can know. NVML reports
    NVLink reachability, not link counts, so an all-NVLink host is taken at full width."""
    ranks = view.ranks
    p, hosts, sm = len(ranks), len(view.hosts), min(r.sm for r in ranks)
    nic = nic_gbps if nic_gbps is not None else _p("nic.ndr") * _p("nics_per_gpu")
    if p == 1:
        return GroupFabric(1, 1, sm, "self", nvlink_gbps(sm) or pcie_gbps(sm), True, False)
    multicast = all(r.multicast for r in ranks)
    if hosts == 1 and view.nvlink_all():
        return GroupFabric(p, 1, sm, "nvswitch" if multicast else "nvlink", nvlink_gbps(sm),
                           True, multicast)
    if hosts > 1 and view.same_fabric_domain() and all(
            r.fabric_state == FabricState.COMPLETED for r in ranks):
        return GroupFabric(p, hosts, sm, "mnnvl", nvlink_gbps(sm), True, multicast)
    if hosts == 1:
        return GroupFabric(p, 1, sm, "pcie", pcie_gbps(sm), True, False)
    return GroupFabric(p, hosts, sm, "net", nvlink_gbps(sm) or pcie_gbps(sm), True, False, nic)


# -- algorithms ------------------------------------------------------------------------------


def _bw(f: GroupFabric, eff: str) -> float:
    return _p(eff) * f.link_gbps * 1e9


def _peer(f: GroupFabric, per_peer: float, eff: str = "eff.peer") -> float:
    """Seconds to move `per_peer` bytes between this rank and each peer."""
    ports = (f.ranks - 1) if f.aggregate else 1
    return ports * per_peer / _bw(f, eff)


def _sync_penalty(f: GroupFabric, syncs: int) -> float:
    # The kernel intercepts were measured over NVLink; a flag exchange over PCIe costs what
    # NCCL charges for one PCIe step more than one NVLink step.
    return syncs * _hop_extra(f) * US


def _hop_extra(f: GroupFabric) -> float:
    """Microseconds one flag round costs on this fabric beyond one over NVLink (PCIe, net)."""
    return _p(f"nccl.hop.{f.hop}.LL") - _p("nccl.hop.nvlink.LL")


def _two_shot_alpha(sm: int) -> float:
    """Fixed cost (us) of the peer-pointer two-shot kernel: measured per GPU generation where
    a source exists (Ampere, Hopper); other generations take Hopper's."""
    key = f"alpha.peer_two_shot.sm{sm // 10}0"
    return _p(key if key in PARAMS else "alpha.peer_two_shot.sm90")


def _nccl_ring(f: GroupFabric, n: float) -> tuple[float, str]:
    p = f.ranks
    nsteps = 2 * (p - 1)
    nodes = 1 if f.path in ("nvswitch", "mnnvl") else f.hosts   # NCCL: MNNVL is one node
    inter = 2 * nodes if nodes > 1 else 0
    intra_hw = "pcie" if f.path == "pcie" else "nvlink"
    link = f.link_gbps if nodes == 1 else min(f.link_gbps, f.nic_gbps)
    best = (math.inf, "")
    for proto in _PROTOCOLS:
        if proto == "LL128" and not (f.sm in (70, 80, 90) and intra_hw == "nvlink"):
            continue   # NCCL enables LL128 by default only on Volta/Ampere/Hopper over NVLink
        lat = (_p(f"nccl.base.{proto}") + (nsteps - inter) * _p(f"nccl.hop.{intra_hw}.{proto}")
               + inter * _p(f"nccl.hop.net.{proto}"))
        algbw = _p("eff.ring") * link * 1e9 * _p(f"nccl.bw.{proto}") * p / nsteps
        t = lat * US + n / algbw
        if t < best[0]:
            best = (t, proto)
    return best


def predict(backend: str, algorithm: str, nbytes: float, fabric: GroupFabric) -> float:
    """Predicted seconds for one all-reduce of `nbytes` by `backend` with `algorithm`.
    math.inf where the algorithm cannot run on this fabric (multicast without NVSwitch)."""
    known = backend_algorithms()
    if algorithm not in known.get(backend, ()):
        raise ValueError(f"backend {backend!r} has no algorithm {algorithm!r}; known: "
                         f"{ {b: list(a) for b, a in known.items()} }")
    family = cost_family(backend)
    f, n, p = fabric, float(nbytes), fabric.ranks
    if p == 1:
        return 0.0
    if algorithm == "multicast":
        if not f.multicast or (backend == "nccl" and f.nccl_nvls is False):
            return math.inf
        if family == "nccl":
            # NCCL's NVLS reaches its large-message bandwidth only past a knee.
            knee = _p("nvls.knee") * MiB
            return (_p("nccl.nvls") * US + _sync_penalty(f, 2) + min(n, knee) / _bw(f, "eff.nvls")
                    + max(0.0, n - knee) / _bw(f, "eff.nvls.large"))
        return _p("alpha.multimem") * US + _sync_penalty(f, 2) + n / _bw(f, "eff.multimem")
    if family == "nccl":
        return _nccl_ring(f, n)[0]
    if family == "peer":
        # symm's peer kernels are the custom all-reduce's over mapped symmetric buffers.
        if algorithm == "one-shot":
            return _p("alpha.peer_one_shot") * US + _sync_penalty(f, 2) + _peer(f, n)
        return (_two_shot_alpha(f.sm) * US + _sync_penalty(f, 3)
                + 2 * _peer(f, n / p, "eff.peer_two_shot"))
    # lamport (fabric): Lamport kernels (FlashInfer / TRT-LLM MNNVL), no barrier between phases; the
    # second phase costs one more flag round. Their slopes are not the vLLM two-stage kernel's,
    # so both algorithms keep the one-shot efficiency.
    alpha = _p("alpha.lamport_one_shot") * US + _sync_penalty(f, 1)
    if algorithm == "one-shot":
        return alpha + _peer(f, n)
    return (alpha + (_p("alpha.lamport_two_shot_extra") + _hop_extra(f)) * US
            + 2 * _peer(f, n / p))


def nccl_protocol(nbytes: float, fabric: GroupFabric) -> str:
    """The ring protocol NCCL's model would pick (LL, LL128 or Simple), for display."""
    return _nccl_ring(fabric, float(nbytes))[1]


def best(backend: str, nbytes: float, fabric: GroupFabric) -> tuple[str, float]:
    """(algorithm, seconds) of the backend's fastest algorithm at this size."""
    options = [(predict(backend, a, nbytes, fabric), a) for a in backend_algorithms()[backend]]
    t, a = min(options)
    return a, t


def _timer(c: str | tuple[str, str], fabric: GroupFabric) -> Callable[[float], float]:
    if isinstance(c, tuple):
        return lambda n: predict(c[0], c[1], n, fabric)
    return lambda n: best(c, n, fabric)[1]


def _label(c: str | tuple[str, str]) -> str:
    return c if isinstance(c, str) else f"{c[0]} {c[1]}"


@dataclass(frozen=True)
class Crossover:
    nbytes: float            # size where the two predictions are equal
    below: str               # the faster one just below
    above: str               # the faster one just above


def crossovers(a: str | tuple[str, str], b: str | tuple[str, str], fabric: GroupFabric,
               lo: float = 1 * KiB, hi: float = 1 * GiB) -> list[Crossover]:
    """Sizes in [lo, hi] where the faster of `a` and `b` changes, found on a log grid of 16
    points per octave and refined by bisection to 0.1%."""
    ta, tb = _timer(a, fabric), _timer(b, fabric)

    def diff(n: float) -> float:
        x, y = ta(n), tb(n)
        if math.isinf(x) and math.isinf(y):
            return 0.0
        return x - y

    steps = max(1, int(math.log2(hi / lo) * 16))
    grid = [lo * (hi / lo) ** (i / steps) for i in range(steps + 1)]
    out: list[Crossover] = []
    for x0, x1 in zip(grid, grid[1:]):
        d0, d1 = diff(x0), diff(x1)
        if d0 == 0 or d1 == 0 or (d0 < 0) == (d1 < 0):
            continue
        while x1 / x0 > 1.001:
            mid = math.sqrt(x0 * x1)
            if (diff(mid) < 0) == (d0 < 0):
                x0 = mid
            else:
                x1 = mid
        first, second = (_label(a), _label(b)) if d0 < 0 else (_label(b), _label(a))
        out.append(Crossover(math.sqrt(x0 * x1), first, second))
    return out


def ordered_by_model(backends: Iterable[str], nbytes: float, fabric: GroupFabric) -> tuple[str, ...]:
    """`backends` sorted by predicted time at `nbytes` (best algorithm each); ties keep order."""
    names = list(backends)
    return tuple(sorted(names, key=lambda b: (best(b, nbytes, fabric)[1], names.index(b))))


def parameter_table() -> list[tuple[str, float, str, str, bool]]:
    """PARAMS as rows (name, value, unit, source, estimate), for documentation and tests."""
    return [(k, v.value, v.unit, v.source, v.estimate) for k, v in PARAMS.items()]


def with_nccl(fabric: GroupFabric, nvls: bool) -> GroupFabric:
    """The fabric with NCCL's NVLS eligibility as NCCL's rules decide it (nccl_rules.decide)."""
    return replace(fabric, nccl_nvls=nvls)
