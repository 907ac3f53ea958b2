"""Rank 0 skips the second barrier and waits in a third collective: a hang."""

import torch.distributed as dist

dist.init_process_group("gloo")
dist.barrier()
if dist.get_rank() != 0:
    dist.barrier()
else:
    objs = [None] * dist.get_world_size()
    dist.all_gather_object(objs, "late")
dist.destroy_process_group()
