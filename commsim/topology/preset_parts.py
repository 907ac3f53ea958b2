"""Parts the preset modules share: GPU and cluster UUIDs, per-host GPU lists, the two fabric
states a board without MNNVL reports, the two-socket PCIe layout of server boxes, and the three
machine shapes every preset is built from (presets.py, presets_pcie.py, scale.py): an
NVSwitch box, a rack of trays in one NVLink domain, and a single-host box without a fabric."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Callable

from commsim.topology.model import (
    Cluster, FabricInfo, FabricState, Gpu, GpuRef, Host, Link, NvlinkDomain, full_matrix, matrix_from,
)

GiB = 1 << 30

# NVSwitch boards outside MNNVL report a COMPLETED fabric with an all-zero cluster UUID; NCCL
# and NVSHMEM read the zero UUID as "no MNNVL" (row F2).
SINGLE_NODE_FABRIC = FabricInfo(state=FabricState.COMPLETED)
# PCIe cards and NVLink-bridge pairs have no fabric manager: NVML state NOT_SUPPORTED (nvml.h).
NO_FABRIC = FabricInfo()


@dataclass(frozen=True)
class Preset:
    """A preset, declared once: its name, the builder that makes the machine under that name
    (the cluster's own name), and the one-line summary `commsim topo list` prints."""

    name: str
    builder: Callable[[str], Cluster]
    summary: str

    def build(self) -> Cluster:
        return self.builder(self.name)


def gpu_uuid(host: str, index: int) -> str:
    h = hashlib.sha256(f"{host}/{index}".encode()).hexdigest()
    return f"GPU-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}"


def cluster_uuid(name: str) -> bytes:
    return hashlib.sha256(f"cluster:{name}".encode()).digest()[:16]


def gpus(host: str, n: int, **attrs: object) -> tuple[Gpu, ...]:
    return tuple(Gpu(index=i, uuid=gpu_uuid(host, i), **attrs) for i in range(n))


def two_socket_pcie(i: int, j: int, per_socket: int, p2p_same_socket: bool,
                    p2p_cross_socket: bool) -> Link:
    """GPUs 0..per_socket-1 on socket 0, the rest on socket 1; pairs (0,1), (2,3) share a PCIe
    switch (PIX), other same-socket pairs cross host bridges (NODE), cross-socket pairs SYS."""
    si, sj = i // per_socket, j // per_socket
    if si != sj:
        return Link("SYS", p2p=p2p_cross_socket)
    if i // 2 == j // 2:
        return Link("PIX", p2p=p2p_same_socket)
    return Link("NODE", p2p=p2p_same_socket)


# ---- machine shapes --------------------------------------------------------------------------

def nvswitch_box(name: str, host: str, source: str, *, model: str, cc: tuple[int, int], mem: int,
                 nvlinks: int = 18) -> Cluster:
    """One host of 8 GPUs on NVSwitch (HGX / DGX baseboards)."""
    # All-to-all NVSwitch: every pair NV<nvlinks>, P2P on, multicast supported.
    # HANDLE_TYPE_FABRIC_SUPPORTED is reported 1 even without IMEX, and cuMemCreate(FABRIC)
    # then fails NOT_PERMITTED (DeepEP#487, row V3): no IMEX channels on these hosts.
    g = gpus(host, 8, model=model, compute_capability=cc, memory_bytes=mem,
             fabric_handle=True, multicast=True, fabric=SINGLE_NODE_FABRIC)
    h = Host(name=host, gpus=g, links=full_matrix(8, Link("NV", nvlinks)))
    dom = NvlinkDomain(f"{host}-nvswitch", tuple(GpuRef(host, i) for i in range(8)))
    return Cluster(name=name, hosts=(h,), domains=(dom,), source=source)


def tray_rack(name: str, trays: int, source: str, *, trays_per_clique: int | None = None,
              gpus_per_tray: int = 4, unit: str = "tray", model: str = "NVIDIA GB200",
              cc: tuple[int, int] = (10, 0), mem: int = 186 * GiB) -> Cluster:
    """`trays` OS instances (`<name>-<unit>NN`) of `gpus_per_tray` GPUs in one NVLink domain,
    NVML clique k + 1 for the k-th run of `trays_per_clique` trays (default: one clique)."""
    # One GB200 compute tray = one OS instance with 4 GPUs (2 superchips), NV18 between them as
    # `nvidia-smi topo -m` prints it (seeds/000); aarch64 Grace CPUs. Every tray has IMEX
    # channel 0; NVML: one cluster UUID for the rack, state COMPLETED (NVIDIA Multi-Node Tuning Guide).
    uuid = cluster_uuid(name)
    per_clique = trays_per_clique or trays
    hosts, members = [], []
    for t in range(trays):
        hn = f"{name}-{unit}{t:02d}"
        fab = FabricInfo(cluster_uuid=uuid, clique_id=1 + t // per_clique, state=FabricState.COMPLETED)
        g = gpus(hn, gpus_per_tray, model=model, compute_capability=cc,
                 memory_bytes=mem, fabric_handle=True, multicast=True, fabric=fab)
        hosts.append(Host(name=hn, gpus=g, links=full_matrix(gpus_per_tray, Link("NV", 18)),
                          imex_channels=(0,), arch="aarch64"))
        members += [GpuRef(hn, i) for i in range(gpus_per_tray)]
    dom = NvlinkDomain(f"{name}-domain", tuple(members), cluster_uuid=uuid)
    return Cluster(name=name, hosts=tuple(hosts), domains=(dom,), source=source)


def pcie_box(name: str, host: str, n: int, cell: Callable[[int, int], Link], source: str,
             arch: str = "x86_64", **attrs: object) -> Cluster:
    """One host of `n` GPUs without an NVLink fabric (PCIe, bridges, meshes): `cell(i, j)` is
    the link between GPUs i and j; `attrs` go to every GPU."""
    h = Host(name=host, gpus=gpus(host, n, fabric=NO_FABRIC, **attrs),
             links=matrix_from(n, cell), arch=arch)
    return Cluster(name=name, hosts=(h,), source=source)
