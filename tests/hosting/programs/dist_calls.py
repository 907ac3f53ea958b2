"""Every torch.distributed call the hosting surface serves, with CPU tensors (gloo beside NCCL,
as a pure "nccl" group refuses them); one RESULT line."""

import json

import torch
import torch.distributed as dist

dist.init_process_group(backend="cpu:gloo,cuda:nccl")   # CPU tensors and objects: gloo
assert dist.is_initialized()
rank, world = dist.get_rank(), dist.get_world_size()
evens = dist.new_group([r for r in range(world) if r % 2 == 0])
odds = dist.new_group([r for r in range(world) if r % 2 == 1])
mine = evens if rank % 2 == 0 else odds
objs = [None] * world
dist.all_gather_object(objs, {"rank": rank})
box = [f"from{rank}", rank * 10] if rank == world - 1 else [None, None]
dist.broadcast_object_list(box, src=world - 1)
gathered = [None] * world if rank == 0 else None
dist.gather_object(rank * rank, gathered, dst=0)
sub = [None] * dist.get_world_size(mine)
dist.all_gather_object(sub, rank, group=mine)
t = torch.tensor([float(rank), 1.0])
dist.all_reduce(t)
mx = torch.tensor([rank])
dist.all_reduce(mx, op=dist.ReduceOp.MAX)
bits = {}
for name in ("BAND", "BOR", "BXOR"):             # gloo's bitwise ops on an integral tensor
    x = torch.tensor([rank + 1, 6 | rank], dtype=torch.int32)
    dist.all_reduce(x, op=getattr(dist.ReduceOp, name))
    bits[name] = x.tolist()
try:                                             # ... and its refusal of a float one
    dist.all_reduce(torch.ones(1), op=dist.ReduceOp.BAND)
    refused = None
except RuntimeError as e:
    refused = str(e).splitlines()[0]
parts = [torch.zeros(2) for _ in range(world)]
dist.all_gather(parts, torch.tensor([rank, -rank], dtype=torch.float32))
b = torch.arange(3, dtype=torch.float32) * (rank + 1)
dist.broadcast(b, src=1 % world)
dist.barrier()
dist.barrier(group=mine)
print("RESULT " + json.dumps({
    "rank": rank, "world": world, "backend": dist.get_backend(),
    "group_ranks": dist.get_process_group_ranks(mine), "group_rank": dist.get_rank(mine),
    "group_size": dist.get_world_size(mine), "objs": objs, "box": box, "gathered": gathered,
    "sub": sub, "sum": t.tolist(), "max": mx.tolist(), "bits": bits, "refused": refused, "parts": [p.tolist() for p in parts],
    "bcast": b.tolist()}))
dist.destroy_process_group()
