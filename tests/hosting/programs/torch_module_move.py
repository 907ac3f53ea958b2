"""A tensor-parallel-style inference step written the way user code is (for commsim's tests):
each rank builds the same small model on the CPU, moves it with `.cuda()`, runs a forward
pass under `torch.inference_mode()` on its shard of the batch, all-reduces the output over
the group, then the model goes back with `.cpu()`. One RESULT line per rank."""

import json
import os

import torch
import torch.distributed as dist


def main() -> None:
    dist.init_process_group(backend="nccl")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    torch.manual_seed(0)                          # the same weights on every rank
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 4))
    first = model[0].weight
    model = model.cuda().eval()
    batch = torch.linspace(-1, 1, 8 * 16).view(8, 16)
    shard = batch[rank::world].cuda()
    with torch.inference_mode():
        out = model(shard).sum(dim=0)
    dist.all_reduce(out)
    want = model.cpu()(batch).sum(dim=0).detach()
    print("RESULT " + json.dumps({
        "rank": rank, "device": str(out.device), "same_param": model[0].weight is first,
        "param_device_after_cpu": str(first.device),
        "matches_cpu": bool(torch.allclose(out.cpu(), want, atol=1e-5)),
    }), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
