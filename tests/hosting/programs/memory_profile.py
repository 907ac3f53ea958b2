"""A serving engine's start-up memory profile, in the style of vLLM's: measure the weights,
run a dummy forward pass, read the allocator's peak, size the KV cache from what is left
under a utilisation target, agree on the smallest block count across ranks, allocate it,
then check that a memory fraction turns an oversized request into torch's OOM error.
One RESULT line per rank."""

import json
import os

import torch
import torch.distributed as dist

BLOCK_BYTES = 2 * 16 * 8 * 128 * 2          # K+V x block size x heads x head dim x fp16
UTILISATION = 0.0009                        # of an 80 GiB H100: about 74 MiB


def main() -> None:
    dist.init_process_group(backend="nccl")
    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    free0, total = torch.cuda.mem_get_info()
    weights = [torch.empty(4 << 20, dtype=torch.float16, device="cuda") for _ in range(2)]
    w_bytes = torch.cuda.memory_allocated()
    with torch.no_grad():
        x = torch.ones(1 << 20, dtype=torch.float16, device="cuda")
        act = [x * 2, x + 1, x.float()]
        a_bytes = torch.cuda.memory_allocated() - w_bytes
        del act, x
    peak = torch.cuda.memory_stats()["allocated_bytes.all.peak"]
    free1, _ = torch.cuda.mem_get_info()
    non_torch = (total - free1) - torch.cuda.memory_reserved()
    budget = int(total * UTILISATION) - peak - max(non_torch, 0)
    blocks = torch.tensor([max(budget // BLOCK_BYTES, 0)], device="cuda")
    dist.all_reduce(blocks, op=dist.ReduceOp.MIN)
    kv = torch.empty(int(blocks.item()) * BLOCK_BYTES, dtype=torch.uint8, device="cuda")
    torch.cuda.set_per_process_memory_fraction(0.001)
    try:
        torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
        caught = False
    except torch.OutOfMemoryError:
        caught = True
    print("RESULT " + json.dumps({"rank": dist.get_rank(), "weights": w_bytes,
                                  "activations": a_bytes, "peak": peak,
                                  "kv_blocks": int(blocks.item()), "oom_caught": caught,
                                  "ooms": torch.cuda.memory_stats()["num_ooms"]}))
    del kv, weights
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
