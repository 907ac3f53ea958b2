"""Run by test_torch_dist_group.py under torchrun (2 CPU processes, gloo): the Group interface
over torch.distributed as commsim.devicecheck.e2e builds it, and a Communicator on it (nccl backend over per-process SimDrivers,
the only backend separate simulated fabrics can share)."""

from __future__ import annotations

import sys

import numpy as np
import torch
import torch.distributed as dist

from commsim.communicator import Communicator
from commsim.group.base import Group
from commsim.policy import Policy
from commsim.sim import SimFabric, spawn_driver
from commsim.topology.model import GpuRef
from commsim.topology.presets import build
from commsim.group.torch_dist import ProcessWorld


def _scaled_sum(parts, k):
    return np.sum(np.stack(parts), axis=0) * k


def main() -> int:
    world = ProcessWorld.from_env()
    g = world.join()
    r, n = g.rank, g.size
    assert isinstance(g, Group) and n == 2 and g.global_ranks == (0, 1) and g.name == "world"
    assert g.all_gather_object({"rank": r, "blob": bytes([r]) * 64}) == \
        [{"rank": k, "blob": bytes([k]) * 64} for k in range(n)]
    assert g.broadcast_object(f"from {r}", 1) == "from 1"
    assert g.all_reduce_object(r + 1, "sum") == 3 and g.all_reduce_object(r == 0, "and") is False
    assert g.all_reduce_object(r, "min") == 0 and g.all_reduce_object(r == 0, "or") is True
    g.barrier()
    assert g.exchange("k0", {"r": r}) == [{"r": 0}, {"r": 1}]
    mine = np.full(3, r + 1.0)
    got = g.combine_arrays(mine, _scaled_sum, (2,), tag="combine")
    assert got.tolist() == [6.0] * 3 and not got.flags.writeable and mine.flags.writeable
    sub = g.new_subgroup([1], "one")
    assert (sub is None) == (r == 0)
    if sub is not None:
        assert sub.size == 1 and sub.rank == 0 and sub.global_ranks == (1,)
    cluster = build("hgx-h100-8")
    drv = spawn_driver(SimFabric(cluster, seed=0), GpuRef(cluster.hosts[0].name, r))
    comm = Communicator(g, drv, Policy(order=("nccl",)))
    y = comm.all_reduce(torch.full((1024,), float(r + 1), dtype=torch.bfloat16))
    assert float(y[0]) == 3.0 and comm.chosen("all_reduce", 2048) == "nccl", comm.explain()
    comm.close()
    g.barrier()
    world.finish()
    if r == 0:
        print("torch group ok", flush=True)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
