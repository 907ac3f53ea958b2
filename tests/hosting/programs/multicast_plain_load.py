"""A plain read through a symmetric-memory multicast address: cudaMemcpy from
`multicast_ptr` to the host, as code that mistakes the multicast mapping for a buffer does.
Only multimem.* instructions are valid there (row MC7): the result is undefined, not a CUDA
error, so every call succeeds. One RESULT line per rank."""

import json
import os

import numpy as np
import torch
import torch.distributed as dist
import torch.distributed._symmetric_memory as symm_mem
from cuda.bindings import runtime as rt

dist.init_process_group(backend="nccl")
rank = dist.get_rank()
torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
buf = symm_mem.empty(1024, dtype=torch.float32, device="cuda")
buf.fill_(rank + 1)
hdl = symm_mem.rendezvous(buf, dist.group.WORLD.group_name)
host = np.zeros(16, dtype=np.uint8)
err = rt.cudaMemcpy(host.ctypes.data, hdl.multicast_ptr, 16, rt.cudaMemcpyKind.cudaMemcpyDeviceToHost)
print("RESULT " + json.dumps({"rank": rank, "mc": hdl.multicast_ptr != 0, "err": int(err[0])}),
      flush=True)
dist.barrier()
