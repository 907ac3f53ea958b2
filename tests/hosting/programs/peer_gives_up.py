"""Rank 0 exits with an error before the barrier its peers wait in: their failures are
knock-ons of rank 0's."""

import sys

import torch.distributed as dist

dist.init_process_group("gloo")
if dist.get_rank() == 0:
    sys.exit("rank 0 gives up: no usable configuration")
dist.barrier()
dist.destroy_process_group()
