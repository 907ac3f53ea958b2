"""Everything one simulated GPU reports about itself, in the units the device APIs use: the
cluster's GPU (name, capability, memory, UUID), its part's figures and its capability's limits
(commsim/topology/gpu_models.py), and where the host put it (host_layout.py). The surfaces
(NVML, cudart, cuda-python, torch) read one DeviceProps, so they cannot disagree.

A GPU whose model matches no part reports 0 for the part's figures, as it would without a
source: commsim invents none.
"""

from __future__ import annotations

from dataclasses import dataclass

from commsim.hosting.state.host_layout import PciAddress, pci_address
from commsim.topology import gpu_models
from commsim.topology.model import Cluster, GpuRef


@dataclass(frozen=True)
class DeviceProps:
    name: str
    major: int
    minor: int
    total_memory: int
    uuid: str
    pci: PciAddress
    pci_device_id: int                  # product id (NVML pciDeviceId >> 16)
    multi_processor_count: int
    l2_cache_size: int                  # bytes
    clock_rate_khz: int
    memory_clock_rate_khz: int
    memory_bus_width: int               # bits
    integrated: int
    warp_size: int
    max_threads_per_block: int
    max_threads_per_multi_processor: int
    shared_memory_per_block: int
    shared_memory_per_block_optin: int
    shared_memory_per_multiprocessor: int
    regs_per_block: int
    regs_per_multiprocessor: int


def device_props(cluster: Cluster, ref: GpuRef) -> DeviceProps:
    g = cluster.gpu(ref)
    part = gpu_models.part_of(g.model)
    s = part.silicon or gpu_models.Silicon(0, 0, 0, 0, 0, 0, "")
    lim = gpu_models.LIMITS.get(g.compute_capability) or gpu_models.Limits(0, 0, 0, 0, 0, 0, 0, 0)
    return DeviceProps(
        name=g.model, major=g.compute_capability[0], minor=g.compute_capability[1],
        total_memory=g.memory_bytes, uuid=g.uuid, pci=pci_address(cluster, ref),
        pci_device_id=part.pci_device_id(g.model), multi_processor_count=s.sms,
        l2_cache_size=s.l2_cache, clock_rate_khz=s.clock_mhz * 1000,
        memory_clock_rate_khz=s.memory_clock_mhz * 1000, memory_bus_width=s.memory_bus_bits,
        integrated=int(s.integrated), warp_size=lim.warp_size,
        max_threads_per_block=lim.max_threads_per_block,
        max_threads_per_multi_processor=lim.max_threads_per_sm,
        shared_memory_per_block=lim.shared_memory_per_block,
        shared_memory_per_block_optin=lim.shared_memory_per_block_optin,
        shared_memory_per_multiprocessor=lim.shared_memory_per_sm,
        regs_per_block=lim.registers_per_block, regs_per_multiprocessor=lim.registers_per_sm)
