"""init_process_group() with no backend, as torchrun examples write it, then an all-reduce of
a CUDA tensor: prints each rank's backend and result."""

import json
import os

import torch
import torch.distributed as dist

rank = int(os.environ["RANK"])
torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
dist.init_process_group()
t = torch.full((4,), float(rank + 1), device="cuda")
dist.all_reduce(t)
print("RESULT " + json.dumps({"rank": rank, "backend": str(dist.get_backend()), "sum": t.tolist()}))
dist.destroy_process_group()
