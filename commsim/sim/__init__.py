"""The simulated CUDA driver: SimFabric (ground truth, memory) and per-process SimDriver."""

import os

from commsim.sim.driver import SimDriver
from commsim.sim.fabric import SimFabric, SimProcess
from commsim.sim.faults import ProcessFaults


def set_torch_threads() -> None:
    """Called where a run starts (the CLI, the runner, a rank process), never at import.
    Simulated kernels run one rank at a time on one OS thread; torch's intra-op thread pool
    only adds hand-off cost there (measured on the 2-core machine: a 1 MiB bf16->f32 cast took
    7.3 ms with 2 threads, 0.15 ms with 1). COMMSIM_TORCH_THREADS overrides."""
    import torch
    torch.set_num_threads(int(os.environ.get("COMMSIM_TORCH_THREADS", "1")))


def spawn_driver(fabric: SimFabric, gpu, faults: ProcessFaults | None = None,
                 visible=None) -> SimDriver:
    """A process on `gpu`'s host, current device = `gpu`. By default it sees every GPU of that
    host (how vLLM/sglang workers run: all GPUs visible, torch.cuda.set_device(local_rank));
    `visible` is its CUDA_VISIBLE_DEVICES as host GPU indices, in order: ordinals are
    remapped to that list (row W1; e.g. one GPU per process as Ray places trays)."""
    refs = fabric.cluster.gpu_refs_of(gpu.host)
    if visible is None:
        order, seen = [g.index for g in refs], refs
    else:
        order = list(visible)
        seen = [type(gpu)(gpu.host, i) for i in order]
    if gpu.index not in order:
        raise ValueError(f"{gpu} is not among the visible devices {order}")
    proc = fabric.spawn(gpu.host, seen, faults)
    proc.current = order.index(gpu.index)
    return SimDriver(fabric, proc)


__all__ = ["SimDriver", "SimFabric", "SimProcess", "ProcessFaults", "set_torch_threads", "spawn_driver"]
