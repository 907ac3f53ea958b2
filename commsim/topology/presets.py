"""Presets: real machine shapes, each with the source of its facts.

`build("gb200-nvl72")` returns the whole rack; `build("gb200-nvl72:2")` its first two trays.
Attributes a preset cannot source are chosen as the most plausible value and say so; each
preset names its public sources (vendor pages, datasheets, issue threads).
"""

from __future__ import annotations

from commsim.topology.model import Cluster, Link, TopologyError
from commsim.topology.presets_pcie import PCIE_PRESETS
from commsim.topology.preset_parts import (  # noqa: F401  (_uuid, _cluster_uuid: importers derive the same)
    GiB, Preset, cluster_uuid as _cluster_uuid, gpu_uuid as _uuid, nvswitch_box, pcie_box,
    tray_rack, two_socket_pcie,
)


def hgx_h100_8(name: str) -> Cluster:
    return nvswitch_box(
        name, "hgx-h100-0",
        "HGX/DGX H100: 8 GPUs all-to-all over NVSwitch, 18 NVLink-4 links per GPU, 900 GB/s "
        "(scaleway H100-SXM docs, NVIDIA vGPU NVSwitch page)",
        model="NVIDIA H100 80GB HBM3", cc=(9, 0), mem=80 * GiB)


def hgx_h200_8(name: str) -> Cluster:
    return nvswitch_box(
        name, "hgx-h200-0",
        "HGX H200: same NVSwitch baseboard as H100 with 141 GB HBM3e (NVIDIA vGPU "
        "NVSwitch page lists HGX H200 8-GPU)",
        model="NVIDIA H200", cc=(9, 0), mem=141 * GiB)


def dgx_b200_8(name: str) -> Cluster:
    return nvswitch_box(
        name, "dgx-b200-0",
        "DGX/HGX B200: 8 Blackwell GPUs over NVSwitch, NVLink 5, 1440 GB HBM3e in all; fabric "
        "attribute 1 but no IMEX (DeepEP#487)",
        model="NVIDIA B200", cc=(10, 0), mem=180 * GiB)


def hgx_b300_8(name: str) -> Cluster:
    return nvswitch_box(
        name, "hgx-b300-0",
        "HGX B300: 8 Blackwell Ultra GPUs (CC 10.3) over NVSwitch, fabric attribute 1 but no "
        "IMEX by default (NVIDIA HGX B300 page; vllm-project/vllm#42324)",
        model="NVIDIA B300", cc=(10, 3), mem=288 * GiB)


def gb200_nvl72(name: str) -> Cluster:
    return tray_rack(
        name, 18,
        "GB200 NVL72: 18 x 1RU compute trays of 4 GPUs, each tray its own OS image, 72 GPUs in "
        "one NVLink domain (NVIDIA Multi-Node Tuning Guide)")


def gb300_nvl72(name: str) -> Cluster:
    # Same rack shape as GB200 NVL72 (18 trays x 4 GPUs, one NVLink domain, IMEX per tray);
    # Blackwell Ultra GPUs, compute capability 10.3 (docs/fidelity-rules.md G).
    return tray_rack(
        name, 18,
        "GB300 NVL72: 18 compute trays x 4 Blackwell Ultra GPUs (CC 10.3, 288 GB HBM3e), one "
        "NVLink domain (NVIDIA GB300 NVL72 product page; vllm-project/vllm#42324 SM 10.3)",
        model="NVIDIA GB300", cc=(10, 3), mem=288 * GiB)


def gb200_nvl36x2(name: str) -> Cluster:
    # Two racks of 9 x 2RU trays. The reference leaves how the racks join UNCONFIRMED; modelled
    # as one 72-GPU domain (one cluster UUID) with one NVML clique per rack, which is the
    # "same UUID, different clique" case NCCL treats specially (row F3).
    return tray_rack(
        name, 18,
        "GB200 NVL36x2: two racks of 9 compute trays x 4 GPUs, joined into one 72-GPU domain "
        "(NVIDIA Multi-Node Tuning Guide; cross-rack detail UNCONFIRMED)",
        trays_per_clique=9)


def gh200_nvl32(name: str) -> Cluster:
    # 16 nodes of 2 GH200 superchips (1 Hopper GPU each) on one NVLink switch system. The node
    # split (2 GPUs per OS instance) follows NVIDIA's GH200 NVL32 announcement; marked
    # UNCONFIRMED because no other source at hand states it.
    return tray_rack(
        name, 16,
        "GH200 NVL32: 32 Grace Hopper superchips, 16 nodes, one NVLink domain "
        "(NVIDIA GH200 NVL32 announcement; node split UNCONFIRMED)",
        gpus_per_tray=2, unit="node", model="NVIDIA GH200 144G HBM3e", cc=(9, 0), mem=144 * GiB)


def l40s_8_pcie(name: str) -> Cluster:
    # L40S has no NVLink (PCIe Gen4 x16); whether PCIe P2P works is platform-dependent and
    # UNCONFIRMED. This preset is the box *without* P2P, as the bug reports have it.
    return pcie_box(name, "l40s-0", 8, lambda i, j: two_socket_pcie(i, j, 4, False, False),
                    "8 x L40S PCIe, no NVLink, P2P disabled (vendor spec)",
                    model="NVIDIA L40S", compute_capability=(8, 9), memory_bytes=48 * GiB)


def rtx4090_8(name: str) -> Cluster:
    # GeForce: cudaDeviceCanAccessPeer = 0 for every pair (sglang#4814, nccl-tests#287).
    return pcie_box(name, "rtx4090-0", 8, lambda i, j: two_socket_pcie(i, j, 4, False, False),
                    "8 x RTX 4090, PCIe only, P2P not supported on GeForce (sglang#4814, "
                    "NVIDIA/nccl-tests#287)",
                    model="NVIDIA GeForce RTX 4090", compute_capability=(8, 9),
                    memory_bytes=24 * GiB, gpu_direct_rdma=False)


def a100_pcie_bridge_8(name: str) -> Cluster:
    # NVLink bridges join GPU pairs (0,1), (2,3), ...; NV12 = three bridges of 4 links (pairing
    # and count UNCONFIRMED). Same-socket PCIe P2P allowed, cross-socket not (as on V100 PCIe
    # boxes). No NVSwitch, so no multicast (multicast objects need an NVSwitch).
    def cell(i: int, j: int) -> Link:
        if i // 2 == j // 2:
            return Link("NV", 12)
        return two_socket_pcie(i, j, 4, True, False)

    return pcie_box(name, "a100-pcie-0", 8, cell,
                    "A100 PCIe with NVLink-bridge pairs (vLLM "
                    "flashinfer_all_reduce.py note on bridge-only machines)",
                    model="NVIDIA A100 80GB PCIe", compute_capability=(8, 0), memory_bytes=80 * GiB)


# DGX-1 (V100) hybrid cube-mesh as `nvidia-smi topo -m` prints it on DGX-1V: two quads, each
# fully connected, plus one link from each GPU to its mirror in the other quad; NV2 on the
# doubled links (NVIDIA DGX-1 system architecture whitepaper). Pairs without NVLink are SYS.
_DGX1 = (
    (None, "NV1", "NV1", "NV2", "NV2", "SYS", "SYS", "SYS"),
    ("NV1", None, "NV2", "NV1", "SYS", "NV2", "SYS", "SYS"),
    ("NV1", "NV2", None, "NV2", "SYS", "SYS", "NV1", "SYS"),
    ("NV2", "NV1", "NV2", None, "SYS", "SYS", "SYS", "NV1"),
    ("NV2", "SYS", "SYS", "SYS", None, "NV1", "NV1", "NV2"),
    ("SYS", "NV2", "SYS", "SYS", "NV1", None, "NV2", "NV1"),
    ("SYS", "SYS", "NV1", "SYS", "NV1", "NV2", None, "NV2"),
    ("SYS", "SYS", "SYS", "NV1", "NV2", "NV1", "NV2", None),
)


def dgx1_v100(name: str) -> Cluster:
    # P2P only over NVLink: the SYS pairs cross sockets (V100 cross-socket row).
    return pcie_box(name, "dgx1-0", 8,
                    lambda i, j: Link.parse(_DGX1[i][j], p2p=_DGX1[i][j].startswith("NV")),
                    "DGX-1 V100 hybrid cube-mesh (NVIDIA DGX-1 whitepaper; Azure NDv2 uses "
                    "the same mesh in its published NCCL topology file)",
                    model="Tesla V100-SXM2-32GB", compute_capability=(7, 0), memory_bytes=32 * GiB)


PRESETS: dict[str, Preset] = {p.name: p for p in (
    Preset("hgx-h100-8", hgx_h100_8, "HGX H100, 8 GPUs on NVSwitch, one host"),
    Preset("hgx-h200-8", hgx_h200_8, "HGX H200, 8 GPUs on NVSwitch, one host"),
    Preset("dgx-b200-8", dgx_b200_8, "DGX B200, 8 GPUs on NVSwitch, one host, no IMEX"),
    Preset("gb200-nvl72", gb200_nvl72, "GB200 NVL72 rack, 18 trays x 4 GPUs, one NVLink domain"),
    Preset("gb200-nvl36x2", gb200_nvl36x2, "GB200 NVL36x2, 2 racks x 9 trays x 4 GPUs, one domain, 2 cliques"),
    Preset("gh200-nvl32", gh200_nvl32, "GH200 NVL32, 16 nodes x 2 GPUs, one NVLink domain"),
    Preset("l40s-8-pcie", l40s_8_pcie, "8 x L40S PCIe, no NVLink, no P2P"),
    Preset("rtx4090-8", rtx4090_8, "8 x RTX 4090 PCIe, P2P not supported"),
    Preset("a100-pcie-bridge-8", a100_pcie_bridge_8, "8 x A100 PCIe, NVLink-bridge pairs"),
    Preset("dgx1-v100", dgx1_v100, "DGX-1 V100, 8 GPUs, hybrid cube-mesh NVLink"),
    Preset("gb300-nvl72", gb300_nvl72, "GB300 NVL72 rack, 18 trays x 4 GPUs (CC 10.3), one NVLink domain"),
    Preset("hgx-b300-8", hgx_b300_8, "HGX B300, 8 GPUs (CC 10.3) on NVSwitch, one host, no IMEX"),
    *PCIE_PRESETS,
)}


def build(spec: str) -> Cluster:
    """Build a preset by name, optionally sliced to its first N hosts: `gb200-nvl72:2`."""
    name, _, count = spec.partition(":")
    if name not in PRESETS:
        raise TopologyError(f"unknown preset {name!r}; known presets: {', '.join(PRESETS)}")
    cluster = PRESETS[name].build()
    if count:
        if not count.isdigit():
            raise TopologyError(f"preset slice {spec!r}: after ':' give a host count, e.g. {name}:2")
        cluster = cluster.slice_hosts(int(count))
    return cluster
