"""torch.distributed on CUDA tensors as a test suite writes it, plus what a CUDA tensor must
do on its own (device errors, data_ptr arithmetic, memory statistics). One RESULT line."""

import json
import os

import torch
import torch.distributed as dist

dist.init_process_group(backend="nccl")
rank, world = dist.get_rank(), dist.get_world_size()
torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")) % torch.cuda.device_count())
dev = torch.device("cuda", torch.cuda.current_device())

# all_reduce of random data, checked on the host against the sum every rank computes itself
torch.manual_seed(0)
inputs = [torch.randn(1000, generator=torch.Generator().manual_seed(100 + r)) for r in range(world)]
x = inputs[rank].to(dev)
before = x.data_ptr()
dist.all_reduce(x)
torch.testing.assert_close(x.cpu(), torch.stack(inputs).sum(0))
assert x.data_ptr() == before and x.device == dev

# all_gather_into_tensor / reduce_scatter_tensor / broadcast, in place
mine = torch.full((4,), float(rank), device="cuda")
gathered = torch.empty(4 * world, device="cuda")
dist.all_gather_into_tensor(gathered, mine)
expect = torch.arange(world, dtype=torch.float32).repeat_interleave(4)
torch.testing.assert_close(gathered.cpu(), expect)
big = torch.arange(2 * world, dtype=torch.float32, device=dev) + rank
part = torch.zeros(2, device=dev)
dist.reduce_scatter_tensor(part, big)
full = sum(torch.arange(2 * world, dtype=torch.float32) + r for r in range(world))
torch.testing.assert_close(part.cpu(), full[2 * rank: 2 * rank + 2])
b = torch.full((3,), float(rank + 5), device=dev, dtype=torch.float16)
dist.broadcast(b, src=world - 1)
torch.testing.assert_close(b.cpu(), torch.full((3,), float(world + 4), dtype=torch.float16))

# what a device tensor refuses, with torch's own words
errors = {}
for name, call in {"mixed": lambda: x + torch.ones(1000),
                   "numpy": lambda: x.numpy()}.items():
    try:
        call()
        errors[name] = None
    except (RuntimeError, TypeError) as e:
        errors[name] = f"{type(e).__name__}: {e}"

# data_ptr arithmetic: a slice is its base plus storage_offset * element_size
base = torch.zeros(64, dtype=torch.float32, device="cuda")
s = base[10:]
grid = base.view(8, 8)[2:, 3:]
print("RESULT " + json.dumps({
    "rank": rank, "device": str(x.device), "is_cuda": x.is_cuda, "type": type(x).__name__,
    "errors": errors, "slice_delta": s.data_ptr() - base.data_ptr(),
    "slice_offset": s.storage_offset(), "grid_delta": grid.data_ptr() - base.data_ptr(),
    "grid_offset": grid.storage_offset(), "allocated": torch.cuda.memory_allocated(),
    "repr": repr(b),
}))
