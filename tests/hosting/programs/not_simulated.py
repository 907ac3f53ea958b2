"""Calls a torch.distributed collective the inproc surface does not serve."""

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
dist.all_to_all_single(torch.zeros(dist.get_world_size()), torch.zeros(dist.get_world_size()))
