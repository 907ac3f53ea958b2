"""Prints one RESULT line per rank: what a module of the program read about the rank when it
was imported (import_time_identity) next to what the rank reads now."""

import json
import os
import socket

import import_time_identity as early
import torch.distributed as dist

dist.init_process_group("gloo")
print("RESULT " + json.dumps({
    "rank": dist.get_rank(), "in_rank": early.IN_RANK,
    "at_import": [early.LOCAL_RANK, early.CUDA_VISIBLE_DEVICES, early.HOSTNAME],
    "now": [os.environ.get("LOCAL_RANK"), os.environ.get("CUDA_VISIBLE_DEVICES"),
            socket.gethostname()]}))
dist.barrier()          # no rank leaves while a slower one still connects (gloo's full mesh)
dist.destroy_process_group()
