"""Presets of PCIe machines, with or without NVLink bridges, and the DGX Spark: the shapes
of the workstation and PCIe-server bug reports (docs/fidelity-rules.md §9, GPU models).

None of them has an NVSwitch, so none has multicast objects or fabric handles (rows T2, MC1);
P2P over PCIe follows the part (GeForce never, stock driver) and the socket layout.
"""

from __future__ import annotations

from commsim.topology.model import Cluster, Host, Link
from commsim.topology.preset_parts import GiB, NO_FABRIC, Preset, gpus, pcie_box, two_socket_pcie


_H200_NVL = dict(model="NVIDIA H200 NVL", compute_capability=(9, 0), memory_bytes=141 * GiB)


def h200_nvl_2way_8(name: str) -> Cluster:
    # 2-way bridges join pairs (0,1), (2,3) ...: all 18 links of a GPU go to its one peer (NV18,
    # 900 GB/s per GPU). Same-socket PCIe P2P allowed, cross-socket not (as the A100 preset).
    def cell(i: int, j: int) -> Link:
        return Link("NV", 18) if i // 2 == j // 2 else two_socket_pcie(i, j, 4, True, False)
    return pcie_box(name, "h200-nvl-0", 8, cell,
                "8 x H200 NVL (PCIe) with 2-way NVLink bridges: NV18 pairs, no NVSwitch, no "
                "multicast (NVIDIA H200 NVL product brief; per-pair count derived from 18 links "
                "per GPU, UNCONFIRMED)", **_H200_NVL)


def h200_nvl_4way_8(name: str) -> Cluster:
    # 4-way bridges join GPUs 0-3 and 4-7: a direct all-to-all mesh, the 18 links split over 3
    # peers (NV6). A mesh is not a switch: no multicast, no NVLS (row T2).
    def cell(i: int, j: int) -> Link:
        return Link("NV", 6) if i // 4 == j // 4 else Link("SYS", p2p=False)
    return pcie_box(name, "h200-nvl-0", 8, cell,
                "8 x H200 NVL (PCIe) with 4-way NVLink bridges: two NV6 meshes of 4, no "
                "NVSwitch, no multicast (NVIDIA H200 NVL product brief; NV6 derived from 18 "
                "links over 3 peers, UNCONFIRMED)", **_H200_NVL)


def rtx_pro_6000_4(name: str) -> Cluster:
    # Four RTX PRO 6000 Blackwell Server Edition on PCIe with peer access (vllm#56128: SM 12.0,
    # PCIe P2P, no NVLink, driver 580).
    return pcie_box(name, "rtxpro-0", 4,
                lambda i, j: Link("PIX" if i // 2 == j // 2 else "NODE", p2p=True),
                "4 x RTX PRO 6000 Blackwell Server Edition (SM 12.0), PCIe P2P, no NVLink "
                "(vllm-project/vllm#56128)",
                model="NVIDIA RTX PRO 6000 Blackwell Server Edition", compute_capability=(12, 0),
                memory_bytes=96 * GiB)


def rtx5090_2(name: str) -> Cluster:
    # GeForce: no peer access on the stock driver (patched drivers: row P3 faults).
    return pcie_box(name, "rtx5090-0", 2, lambda i, j: Link("PHB", p2p=False),
                "2 x RTX 5090 (SM 12.0) behind a host bridge, P2P not supported on the stock "
                "driver (aikitoria/open-gpu-kernel-modules#21 PHB topology)",
                model="NVIDIA GeForce RTX 5090", compute_capability=(12, 0),
                memory_bytes=32 * GiB, gpu_direct_rdma=False)


def rtx3090_2_nvlink(name: str) -> Cluster:
    # The 3090 is the last GeForce with an NVLink bridge: NV4 between the pair, P2P over it.
    return pcie_box(name, "rtx3090-0", 2, lambda i, j: Link("NV", 4),
                "2 x RTX 3090 (SM 8.6) with an NVLink bridge (NV4), P2P over the bridge "
                "(noonghunna/club-3090#922)",
                model="NVIDIA GeForce RTX 3090", compute_capability=(8, 6),
                memory_bytes=24 * GiB, gpu_direct_rdma=False)


def dgx_spark_2(name: str) -> Cluster:
    # Two DGX Spark boxes (GB10, SM 12.1, aarch64, 128 GB unified memory) joined by ConnectX-7:
    # one GPU per OS instance, no NVLink, no fabric, no multicast. `dgx-spark-2:1` is one box.
    hosts = tuple(Host(name=f"spark-{k}", links=((None,),), arch="aarch64",
                       gpus=gpus(f"spark-{k}", 1, model="NVIDIA GB10", compute_capability=(12, 1),
                                 memory_bytes=128 * GiB, fabric=NO_FABRIC))
                  for k in range(2))
    return Cluster(name=name, hosts=hosts,
                   source="2 x DGX Spark (GB10, SM 12.1, aarch64, unified memory) over "
                          "ConnectX-7 (NVIDIA/dgx-spark-playbooks#22; defilantech/LLMKube#1422)")


PCIE_PRESETS = (
    Preset("h200-nvl-2way-8", h200_nvl_2way_8, "8 x H200 NVL PCIe, 2-way NVLink bridges (NV18 pairs)"),
    Preset("h200-nvl-4way-8", h200_nvl_4way_8, "8 x H200 NVL PCIe, 4-way NVLink bridges (NV6 meshes of 4)"),
    Preset("rtx-pro-6000-4", rtx_pro_6000_4, "4 x RTX PRO 6000 Blackwell (SM 12.0), PCIe P2P"),
    Preset("rtx5090-2", rtx5090_2, "2 x RTX 5090 (SM 12.0), PCIe, no P2P"),
    Preset("rtx3090-2-nvlink", rtx3090_2_nvlink, "2 x RTX 3090 with an NVLink bridge (NV4)"),
    Preset("dgx-spark-2", dgx_spark_2, "2 x DGX Spark (GB10, SM 12.1), one GPU per host, no NVLink"),
)
