"""Opens the peer's IPC handle and never closes it: a mapping held at exit."""

import ctypes

import torch.distributed as dist


class Handle(ctypes.Structure):
    _fields_ = [("internal", ctypes.c_byte * 128)]


dist.init_process_group("gloo")
with open("/proc/self/maps") as f:
    lib = ctypes.CDLL(next(ln.split()[-1] for ln in f if "libcudart" in ln))
rank = dist.get_rank()
assert lib.cudaSetDevice(rank) == 0
buf = ctypes.c_void_p()
assert lib.cudaMalloc(ctypes.byref(buf), 4096) == 0
h = Handle()
assert lib.cudaIpcGetMemHandle(ctypes.byref(h), buf) == 0
handles = [None, None]
dist.all_gather_object(handles, bytes(h))
peer = ctypes.c_void_p()
assert lib.cudaIpcOpenMemHandle(ctypes.byref(peer), Handle.from_buffer_copy(handles[1 - rank]), 1) == 0
dist.barrier()
dist.barrier()
assert lib.cudaFree(buf) == 0      # freed while the peer still maps it; the peer never closes
dist.destroy_process_group()
