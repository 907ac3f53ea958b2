"""Cost of a hosted rank's CUDA tensors against plain CPU tensors, in one process.

Usage: .venv/bin/python benchmarks/tensor_rate.py [--small N] [--large MIB] [--reps R]

- per-op overhead: `y = x + 1` on a small CUDA tensor (dispatch, a new block from the
  caching allocator, the result placed on the device) against the same op on a CPU tensor;
- large ops: `x.add_(1)` in place and `x + 1` out of place on a large tensor (the CPU kernel
  over the simulated device memory; out of place adds one copy of the result into its block);
- allocation: `torch.empty` on the device (no byte written) against `torch.empty` on the CPU.
Figures only, as ratios within this run: the machine is shared and noisy.
"""

from __future__ import annotations

import argparse
import time
from typing import Any, Callable

import torch

from commsim.hosting.state import session
from commsim.hosting.install import registry as surfaces
from commsim.sim import SimFabric
from commsim.sim.driver import SimDriver
from commsim.topology.model import GpuRef
from commsim.topology.presets import build


def _rank() -> session.HostedRank:
    cluster = build("hgx-h100-8")
    host = cluster.hosts[0]
    fabric = SimFabric(cluster, seed=0)
    gpus = tuple(GpuRef(host.name, g.index) for g in host.gpus)
    proc = fabric.spawn(host.name, gpus)
    return session.HostedRank(rank=0, world_size=1, local_rank=0, local_world_size=1,
                              host=host.name, driver=SimDriver(fabric, proc), cluster=cluster,
                              visible=gpus, shm_dir="")


def _per_call(fn: Callable[[], Any], reps: int) -> float:
    fn()
    t = time.perf_counter()
    for _ in range(reps):
        fn()
    return (time.perf_counter() - t) / reps


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--small", type=int, default=1024, help="elements of the small tensor")
    ap.add_argument("--large", type=int, default=64, help="MiB of the large tensor")
    ap.add_argument("--reps", type=int, default=500)
    args = ap.parse_args()
    surfaces.install_all()
    n_large = (args.large << 20) // 4
    with session.bound(_rank()):
        rows = []
        for name, make in (("cpu", lambda n: torch.ones(n)),
                           ("cuda", lambda n: torch.ones(n, device="cuda"))):
            small, large = make(args.small), make(n_large)
            rows.append((name,
                         _per_call(lambda: small + 1, args.reps),
                         _per_call(lambda: large.add_(1), max(args.reps // 50, 3)),
                         _per_call(lambda: large + 1, max(args.reps // 50, 3)),
                         _per_call(lambda: torch.empty(n_large, device=small.device), args.reps)))
    cpu = rows[0]
    print(f"small {args.small} floats, large {args.large} MiB, {args.reps} reps")
    print(f"{'':6}{'small x+1':>14}{'large add_':>14}{'large x+1':>14}{'empty(large)':>14}")
    for name, *t in rows:
        print(f"{name:6}" + "".join(f"{v * 1e6:>12.1f}us" for v in t))
    print(f"{'ratio':6}" + "".join(f"{b / a:>13.1f}x" for a, b in zip(cpu[1:], rows[1][1:])))


if __name__ == "__main__":
    main()
