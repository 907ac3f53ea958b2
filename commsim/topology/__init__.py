"""Topology: hosts, GPUs, links and NVLink domains as pure data (the simulator's ground truth)."""

from commsim.topology.model import (
    Cluster, FabricInfo, FabricState, Gpu, GpuRef, Host, Link, NvlinkDomain, TopologyError,
    ZERO_UUID, full_matrix, matrix_from,
)
from commsim.topology.presets import PRESETS, build as build_preset

__all__ = [
    "Cluster", "FabricInfo", "FabricState", "Gpu", "GpuRef", "Host", "Link", "NvlinkDomain",
    "TopologyError", "ZERO_UUID", "full_matrix", "matrix_from", "PRESETS", "build_preset",
]
