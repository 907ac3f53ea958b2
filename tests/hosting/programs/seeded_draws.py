"""Every rank seeds torch, torch.cuda, Python's random and numpy alike, then draws with
collectives in between (where an inproc run switches ranks). Separate processes draw the same
numbers on every rank; so must the ranks of one interpreter. One RESULT line per rank."""

import json
import os
import random

import numpy as np
import torch
import torch.distributed as dist


def main() -> None:
    dist.init_process_group(backend="nccl")
    rank = dist.get_rank()
    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    torch.manual_seed(1234)
    random.seed(99)
    np.random.seed(5)
    dist.barrier()
    w = torch.randn(4, device="cuda")
    dist.barrier()
    cpu = torch.rand(3)
    dist.barrier()
    py = random.random()
    dist.barrier()
    npv = float(np.random.rand())
    dist.barrier()
    print("RESULT " + json.dumps({
        "rank": rank, "cuda": [round(x, 6) for x in w.cpu().tolist()],
        "cpu": [round(x, 6) for x in cpu.tolist()], "py": py, "np": npv,
        "py_unseeded_differs": random.Random(0).random(),
    }), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
