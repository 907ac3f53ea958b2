"""The simulated CUDA driver: SimFabric (ground truth, memory) and per-process SimDriver."""

import os

from commsim.sim.driver import SimDriver, spawn_driver
from commsim.sim.fabric import SimFabric, SimProcess
from commsim.sim.faults import ProcessFaults


def set_torch_threads() -> None:
    """Called where simulated kernels are about to run in this process (the scenario runner,
    the in-process launcher of hosted ranks, a rank process), never at import, and not by the
    CLI itself: a verb that runs nothing here (a procs-mode launch, `topo`, `--help`) does not
    pay torch's import.
    Simulated kernels run one rank at a time on one OS thread; torch's intra-op thread pool
    only adds hand-off cost there (measured on the 2-core machine: a 1 MiB bf16->f32 cast took
    7.3 ms with 2 threads, 0.15 ms with 1). COMMSIM_TORCH_THREADS overrides."""
    import torch
    torch.set_num_threads(int(os.environ.get("COMMSIM_TORCH_THREADS", "1")))


__all__ = ["SimDriver", "SimFabric", "SimProcess", "ProcessFaults", "set_torch_threads", "spawn_driver"]
