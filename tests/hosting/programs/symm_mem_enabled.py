"""A gate as PyTorch's async-TP lowering has it: after a symmetric-memory rendezvous over the
world group, use the fused path only where `is_symm_mem_enabled_for_group` says so; this
program needs the fused path and fails without it. Warnings of the deprecated call are
counted. One RESULT line per rank."""

import json
import os
import warnings

import torch
import torch.distributed as dist
import torch.distributed._symmetric_memory as symm_mem

dist.init_process_group(backend="nccl")
rank = dist.get_rank()
torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
name = dist.group.WORLD.group_name
buf = symm_mem.empty(1024, dtype=torch.float32, device="cuda")
symm_mem.rendezvous(buf, name)
enabled = symm_mem.is_symm_mem_enabled_for_group(name)
with warnings.catch_warnings(record=True) as seen:
    warnings.simplefilter("always")
    if os.environ.get("CALL_ENABLE") == "1":
        symm_mem.enable_symm_mem_for_group(name)
print("RESULT " + json.dumps({"rank": rank, "enabled": enabled,
                              "warned": [str(w.category.__name__) for w in seen]}), flush=True)
dist.barrier()
if not enabled:
    raise SystemExit(f"rank {rank}: symmetric memory is not enabled for group {name}: the "
                     f"fused path was skipped")
