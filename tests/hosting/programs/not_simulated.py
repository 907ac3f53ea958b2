"""Calls a torch.distributed collective the inproc surface does not serve."""

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
dist.reduce_scatter_tensor(torch.zeros(1), torch.zeros(dist.get_world_size()))
