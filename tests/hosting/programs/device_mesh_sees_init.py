"""torch's own submodules took torch.distributed functions by `from ... import` before commsim
patched them (device_mesh's is_initialized): they must see the hosted answers. One RESULT line."""

import json

import torch.distributed as dist
import torch.distributed.device_mesh as device_mesh

before = device_mesh.is_initialized()
dist.init_process_group(backend="nccl")
print("RESULT " + json.dumps({"rank": dist.get_rank(), "before": before,
                              "after": device_mesh.is_initialized()}))
dist.destroy_process_group()
