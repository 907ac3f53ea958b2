"""Rank 0 all-reduces while rank 1 all-gathers: a collective mismatch."""

import torch, torch.distributed as dist
dist.init_process_group("gloo")
t = torch.ones(4)
if dist.get_rank() == 0:
    dist.all_reduce(t)
else:
    out = [torch.zeros(4) for _ in range(dist.get_world_size())]
    dist.all_gather(out, t)
