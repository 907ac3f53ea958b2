"""The simulated CUDA driver: SimFabric (ground truth, memory) and per-process SimDriver."""

from .driver import SimDriver
from .fabric import SimFabric, SimProcess
from .faults import ProcessFaults


def spawn_driver(fabric: SimFabric, gpu, faults: ProcessFaults | None = None) -> SimDriver:
    """A process on `gpu`'s host that sees every GPU of that host, current device = `gpu`
    (how vLLM/sglang workers run: all GPUs visible, torch.cuda.set_device(local_rank))."""
    host = fabric.cluster.host(gpu.host)
    proc = fabric.spawn(gpu.host, [type(gpu)(gpu.host, g.index) for g in host.gpus], faults)
    proc.current = gpu.index
    return SimDriver(fabric, proc)


__all__ = ["SimDriver", "SimFabric", "SimProcess", "ProcessFaults", "spawn_driver"]
