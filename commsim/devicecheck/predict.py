"""What the simulator predicts for this machine: the answer to hold a real GPU against.

`fabric_create(text)` runs a SimDriver on the cluster of a scenario text (what `commsim probe`
wrote) and asks it the question the device check then asks the hardware: cuMemCreate of one
granule with a FABRIC handle type. Equal results mean the simulator's rules (rows V2-V4, X2:
fabric attribute, IMEX channel, fabric state) model this machine; a difference is a finding.
`multicast_create(text)` is the same for a one-device cuMulticastCreate.
"""

from __future__ import annotations

from typing import Any

from commsim.driver import alloc_prop, multicast_prop
from commsim.sim import SimFabric, spawn_driver
from commsim.topology.model import GpuRef

FABRIC = 0x8


def _driver(text: str, gpu: int, source: str) -> Any:
    from commsim.scenario import schema

    cluster = schema.loads(text, source).cluster
    return spawn_driver(SimFabric(cluster, seed=0), GpuRef(cluster.hosts[0].name, gpu))


def fabric_create(text: str, gpu: int = 0, source: str = "<probe>") -> Any:
    """The CUresult SimDriver answers for cuMemCreate(granularity, FABRIC prop) on GPU `gpu`
    of the scenario's first host (the memory is released again when it succeeds)."""
    d = _driver(text, gpu, source)
    prop = alloc_prop(gpu, FABRIC)
    err, gran = d.cuMemGetAllocationGranularity(prop, 0)
    if int(err) != 0:
        return err
    err, h = d.cuMemCreate(gran, prop, 0)
    if int(err) == 0:
        d.cuMemRelease(h)
    return err


def multicast_create(text: str, gpu: int = 0, source: str = "<probe>") -> Any:
    """The CUresult SimDriver answers for cuMulticastCreate of a one-device team of one
    multicast granule (rows M1, M3)."""
    d = _driver(text, gpu, source)
    err, mg = d.cuMulticastGetGranularity(multicast_prop(1, 0, 0), 1)
    if int(err) != 0:
        return err
    err, mc = d.cuMulticastCreate(multicast_prop(1, mg, 0))
    if int(err) == 0:
        d.cuMemRelease(mc)
    return err
