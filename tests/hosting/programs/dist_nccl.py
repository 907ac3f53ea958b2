"""torch.distributed over NCCL as a training script uses it: one CUDA device per rank
(LOCAL_RANK), init_process_group("nccl"), an all-reduce, a broadcast and a barrier on CUDA
tensors, then destroy_process_group.

    python dist_nccl.py [--eager] [--check]

--eager passes device_id to init_process_group (the communicator is made there, not at the
first collective). --check: a rank whose numbers differ from the reference exits 1 naming
them, so a verdict alone says whether every rank's bytes were right (the mode-agreement
harness compares verdicts, not output). Prints one RESULT line per rank.
"""

import json
import os
import sys

import torch
import torch.distributed as dist


def main() -> None:
    local = int(os.environ["LOCAL_RANK"])
    device = torch.device("cuda", local)
    torch.cuda.set_device(device)
    dist.init_process_group("nccl", **({"device_id": device} if "--eager" in sys.argv else {}))
    rank, world = dist.get_rank(), dist.get_world_size()
    x = torch.arange(1024, dtype=torch.float32, device=device) + rank
    dist.all_reduce(x)
    b = torch.full((3,), float(rank), device=device)
    dist.broadcast(b, src=world - 1)
    dist.barrier()
    want = torch.arange(1024, dtype=torch.float32) * world + sum(range(world))
    res = {"rank": rank, "all_reduce_ok": bool(torch.equal(x.cpu(), want)),
           "broadcast": b.cpu().tolist()}
    print("RESULT " + json.dumps(res), flush=True)
    dist.destroy_process_group()
    if "--check" in sys.argv and res != {"rank": rank, "all_reduce_ok": True,
                                         "broadcast": [float(world - 1)] * 3}:
        sys.exit(f"rank {rank}: wrong results: {res}")


if __name__ == "__main__":
    main()
