"""Weights handed between ranks the way RLHF weight sync does it (vLLM's colocated examples,
SGLang's update_weights_from_tensor; written for commsim's tests): each rank shares a slice
of a CUDA tensor with `torch.multiprocessing.reductions.reduce_tensor`, the handles are
all-gathered, and each rank rebuilds its right-hand peer's tensor on its own device (the
`args[6] = device` idiom), reads it, writes into it, and reads the peer's write to its own.
The same tensor also goes through torch.multiprocessing's pickler, and is rebuilt twice to
check the handle is opened once. One RESULT line per rank; a failed open is an exception."""

import io
import json
import os
import pickle

import torch
import torch.distributed as dist
from multiprocessing.reduction import ForkingPickler
from torch.multiprocessing.reductions import reduce_tensor


def main() -> None:
    dist.init_process_group(backend="nccl")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    base = torch.arange(64, dtype=torch.float32, device="cuda") * (rank + 1)
    mine = base[8:40]                                  # a view: offset inside the storage
    buf = io.BytesIO()
    ForkingPickler(buf, pickle.HIGHEST_PROTOCOL).dump(mine)
    handles = [None] * world
    dist.all_gather_object(handles, (reduce_tensor(mine.detach()), buf.getvalue()))
    peer = (rank + 1) % world
    (func, args), pickled = handles[peer]
    args = list(args)
    args[6] = torch.cuda.current_device()
    theirs = func(*args)
    again = pickle.loads(pickled)
    seen = theirs[:3].tolist()
    theirs[0] = 1000.0 + rank                          # a write into the peer's memory
    dist.barrier()
    print("RESULT " + json.dumps({
        "rank": rank, "device": str(theirs.device), "seen": seen,
        "same_mapping": again.data_ptr() == theirs.data_ptr(),
        "written_by_left_peer": mine[0].item(),
    }), flush=True)
    del theirs, again
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
