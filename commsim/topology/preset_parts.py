"""Parts the preset modules share: GPU and cluster UUIDs, per-host GPU lists, the two fabric
states a board without MNNVL reports, and the two-socket PCIe layout of server boxes."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Callable

from .model import Cluster, FabricInfo, FabricState, Gpu, Link

GiB = 1 << 30

# NVSwitch boards outside MNNVL report a COMPLETED fabric with an all-zero cluster UUID; NCCL
# and NVSHMEM read the zero UUID as "no MNNVL" (reference §4.2, row F2).
SINGLE_NODE_FABRIC = FabricInfo(state=FabricState.COMPLETED)
# PCIe cards and NVLink-bridge pairs have no fabric manager: NVML state NOT_SUPPORTED (§4.1).
NO_FABRIC = FabricInfo()


@dataclass(frozen=True)
class Preset:
    name: str
    build: Callable[[], Cluster]
    summary: str


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
