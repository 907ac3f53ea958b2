"""Pipeline-style point-to-point on CUDA tensors: a ring exchange through P2POp and
batch_isend_irecv (torch checks each op is torch.distributed.isend / irecv by identity);
one RESULT line."""

import json

import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d

dist.init_process_group(backend="nccl")
rank, world = dist.get_rank(), dist.get_world_size()
torch.cuda.set_device(rank % torch.cuda.device_count())
send = torch.full((4,), float(rank), device="cuda")
recv = torch.empty(4, device="cuda")
ops = [dist.P2POp(dist.isend, send, (rank + 1) % world),
       dist.P2POp(dist.irecv, recv, (rank - 1) % world)]
for work in dist.batch_isend_irecv(ops):
    work.wait()
print("RESULT " + json.dumps({"rank": rank, "got": recv.cpu().tolist(),
                              "same_isend": dist.isend is c10d.isend}))
dist.destroy_process_group()
