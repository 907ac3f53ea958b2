"""A peer's legacy IPC handle opened twice in one process, as a library that caches nothing
does when two of its objects import the same buffer (microsoft/mscclpp#165). Current drivers
hand back the same pointer (row H1); older ones refuse the second open (row H2), which this
program raises as the CUDA error. One RESULT line per rank."""

import ctypes
import json
import os

import torch.distributed as dist
from cuda.bindings import runtime as rt

dist.init_process_group(backend="gloo")
rank, world = dist.get_rank(), dist.get_world_size()
rt.cudaSetDevice(int(os.environ["LOCAL_RANK"]))
err, ptr = rt.cudaMalloc(1 << 20)
err, handle = rt.cudaIpcGetMemHandle(ptr)
handles = [None] * world
dist.all_gather_object(handles, ctypes.string_at(handle.getPtr(), 64))   # 64 bytes travel
peer = (rank + 1) % world
blob = rt.cudaIpcMemHandle_t()
ctypes.memmove(blob.getPtr(), handles[peer], 64)
flag = rt.cudaIpcMemLazyEnablePeerAccess
err1, first = rt.cudaIpcOpenMemHandle(blob, flag)
err2, second = rt.cudaIpcOpenMemHandle(blob, flag)
print("RESULT " + json.dumps({"rank": rank, "first": int(err1), "second": int(err2),
                              "same": int(err2) == 0 and int(first) == int(second)}), flush=True)
dist.barrier()
if int(err2):
    raise RuntimeError(f"CUDA error: {rt.cudaGetErrorString(err2)[1].decode()}")
rt.cudaIpcCloseMemHandle(first)
rt.cudaIpcCloseMemHandle(second)
dist.barrier()
