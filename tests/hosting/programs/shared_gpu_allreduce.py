"""Ranks that may share a GPU (more ranks than visible devices): each takes ordinal
LOCAL_RANK modulo the devices it sees and all-reduces over NCCL. One RESULT line per rank."""

import json
import os

import torch
import torch.distributed as dist

dist.init_process_group(backend="nccl")
local = int(os.environ["LOCAL_RANK"])
torch.cuda.set_device(local % torch.cuda.device_count())
t = torch.ones(4, device="cuda")
dist.all_reduce(t)
print("RESULT " + json.dumps({"rank": dist.get_rank(), "sum": t.sum().item(),
                              "device": torch.cuda.current_device()}), flush=True)
