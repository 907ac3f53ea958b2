"""A GPU-free driver for testing the CUDA rig's process and transport machinery on CPU:
each rig worker builds a SimDriver on its own hgx-h100-8 SimFabric (imported by name in the
spawned worker, so this module must stay importable from the tests/device directory)."""

from __future__ import annotations

from commsim.sim import SimFabric, spawn_driver
from commsim.topology.model import GpuRef
from commsim.topology.presets import build


def sim_driver(gpu: int):
    cluster = build("hgx-h100-8")
    return spawn_driver(SimFabric(cluster, seed=0), GpuRef(cluster.hosts[0].name, gpu))


def no_gpu(gpu: int):
    from device.driver import CudaDriver
    return CudaDriver.create(gpu)
