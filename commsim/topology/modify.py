"""Topology faults: edits of a cluster that model a misconfigured or degraded machine.

Each returns a new Cluster; the ground truth the simulator then answers from is the edited one.
Driver-level faults (out of memory at the k-th allocation, a call failing with a code) live
in `commsim.sim.faults`, because they are about calls, not about the machine.
"""

from __future__ import annotations

import dataclasses

from commsim.topology.model import Cluster, FabricState, GpuRef, NVML_ERROR_UNKNOWN, ZERO_UUID


def without_imex(cluster: Cluster, host: str) -> Cluster:
    """No usable IMEX channel on `host` (not created, wrong major/minor, not mounted):
    cuMemCreate/Import with FABRIC answer NOT_PERMITTED there (rows V3, V5)."""
    return cluster.replace_host(host, imex_channels=())


def with_fabric_state(cluster: Cluster, ref: GpuRef, state: FabricState,
                      status_ok: bool = True) -> Cluster:
    """NVML reports `state` for this GPU (e.g. IN_PROGRESS: fabric manager not done, row F1)."""
    g = cluster.gpu(ref)
    fab = dataclasses.replace(g.fabric, state=FabricState(state),
                              status=0 if status_ok else NVML_ERROR_UNKNOWN)
    return cluster.replace_gpu(ref, fabric=fab)


def with_zero_cluster_uuid(cluster: Cluster, ref: GpuRef) -> Cluster:
    """NVML reports an all-zero cluster UUID for this GPU (row F2)."""
    g = cluster.gpu(ref)
    return cluster.replace_gpu(ref, fabric=dataclasses.replace(g.fabric, cluster_uuid=ZERO_UUID))


def without_p2p(cluster: Cluster, host: str, i: int, j: int) -> Cluster:
    """cuDeviceCanAccessPeer answers 0 between GPUs i and j of `host` (row L10)."""
    return cluster.set_p2p(host, i, j, False)


def without_multicast(cluster: Cluster, ref: GpuRef) -> Cluster:
    """MULTICAST_SUPPORTED = 0 on this GPU (row M1), e.g. unified memory off under vGPU."""
    return cluster.replace_gpu(ref, multicast=False)


def with_nvlinks_down(cluster: Cluster, ref: GpuRef) -> Cluster:
    """Some P2P-capable NVLink of this GPU is inactive (what FlashInfer / TRT-LLM check)."""
    return cluster.replace_gpu(ref, nvlinks_up=False)
