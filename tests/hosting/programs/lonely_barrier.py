"""Rank 0 never reaches the barrier the others wait in: a hang."""

import time

import torch.distributed as dist

dist.init_process_group("gloo")
if dist.get_rank() == 0:
    time.sleep(600)
else:
    dist.barrier()
dist.destroy_process_group()
