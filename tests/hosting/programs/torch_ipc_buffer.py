"""A custom all-reduce buffer set up the way serving stacks do it (vLLM's CustomAllreduce
style, written for commsim's tests): the buffer is a torch tensor on the current device, its
IPC handle comes from `data_ptr()` (the handle names the allocation's base; the offset of
the tensor inside it travels along, as torch's `_share_cuda_` sends it), the handles are
all-gathered, every peer's is opened through the ctypes libcudart found in /proc/self/maps,
and the bytes a peer wrote with torch are read through the mapping, and written back
through it for the owner to read with torch. One RESULT line per rank.
"""

import ctypes
import json
import os

import torch
import torch.distributed as dist

from ctypes_cudart import IpcHandle, check, libcudart
from cuda.bindings import driver as cu

D2H, H2D = 2, 1                     # cudaMemcpyKind
SIZE = 64 << 10


def pattern(rank: int) -> torch.Tensor:
    return (torch.arange(SIZE, dtype=torch.int64) * 7 + rank * 13) % 251


def main() -> None:
    dist.init_process_group(backend="nccl")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")) % torch.cuda.device_count())
    lib = libcudart()
    # A small tensor first, so the buffer is not at the start of its allocator segment.
    pad = torch.zeros(100, dtype=torch.uint8, device="cuda")
    buf = torch.empty(SIZE, dtype=torch.uint8, device=torch.cuda.current_device())
    buf.copy_(pattern(rank).to(torch.uint8))          # written with torch, on the device
    ptr = buf.data_ptr()
    err, base = cu.cuPointerGetAttribute(
        cu.CUpointer_attribute.CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, ptr)
    assert int(err) == 0, err
    offset = ptr - int(base)
    handle = IpcHandle()
    check(lib, lib.cudaIpcGetMemHandle(ctypes.byref(handle), ptr))
    everyone = [None] * world
    dist.all_gather_object(everyone, (bytes(handle), offset))
    opened, mapped, agree = {}, [], True
    host = torch.empty(SIZE, dtype=torch.uint8)
    for peer, (blob, off) in enumerate(everyone):
        if peer == rank:
            continue
        p = ctypes.c_void_p()
        check(lib, lib.cudaIpcOpenMemHandle(ctypes.byref(p), IpcHandle.from_buffer_copy(blob), 1))
        mapped.append(p.value)
        opened[peer] = p.value + off
        check(lib, lib.cudaMemcpy(host.data_ptr(), opened[peer], SIZE, D2H))
        agree &= torch.equal(host, pattern(peer).to(torch.uint8))
    dist.barrier()
    # Each rank writes a marker into its right neighbour's buffer through the IPC mapping;
    # the neighbour reads it with torch.
    right = (rank + 1) % world
    marker = torch.full((16,), 200 + rank, dtype=torch.uint8)
    if right != rank:
        check(lib, lib.cudaMemcpy(opened[right], marker.data_ptr(), 16, H2D))
    dist.barrier()
    seen = buf[:16].cpu().tolist()
    for p in mapped:
        check(lib, lib.cudaIpcCloseMemHandle(p))
    dist.barrier()
    print("RESULT " + json.dumps({"rank": rank, "peers_agree": bool(agree), "offset": offset,
                                  "seen": seen, "pad": pad.data_ptr(), "ptr": ptr}))


if __name__ == "__main__":
    main()
