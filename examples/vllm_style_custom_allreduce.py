"""A custom all-reduce set-up in the style of vLLM's `CustomAllreduce` (seed 002, vLLM#52778).

What the real code does, and this program does in its own words: before choosing the custom
all-reduce it asks whether every rank of the group runs on the same node (a POSIX shared
memory segment made by rank 0 is opened by the others: two OS instances do not share
/dev/shm); a world of two ranks takes a shortcut (a pair is taken as directly connected),
and the set-up ends in graph buffer registration: each rank's buffers are exported with
cudaIpcGetMemHandle, the handles all-gathered and opened with cudaIpcOpenMemHandle. With TP=2
across two GB200 trays (one GPU visible per process, as Ray places the ranks) the shortcut
admits the pair and the open dies: 'invalid resource handle'.

    commsim exec --machine gb200-nvl72:2 --nproc-per-host 1 --visible one -- python examples/vllm_style_custom_allreduce.py
    ... --fix   consults the same-node probe before the world-size-2 shortcut (what the vLLM fix
                does: no node-local custom all-reduce, no IPC graph registration across nodes);
                the group falls back to the regular all-reduce.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import secrets
from multiprocessing import shared_memory

import torch
import torch.distributed as dist

# --- a minimal libcudart binding, loaded as vLLM's cuda_wrapper does (by path from the maps) --


class IpcHandle(ctypes.Structure):
    _fields_ = [("internal", ctypes.c_byte * 128)]


def _libcudart() -> ctypes.CDLL:
    with open("/proc/self/maps") as f:
        paths = {ln.split()[-1] for ln in f if "libcudart" in ln and len(ln.split()) >= 6}
    if not paths:
        raise RuntimeError("could not find libcudart among the loaded libraries")
    lib = ctypes.CDLL(sorted(paths)[0])
    sig = {
        "cudaSetDevice": (ctypes.c_int, [ctypes.c_int]),
        "cudaGetDeviceCount": (ctypes.c_int, [ctypes.POINTER(ctypes.c_int)]),
        "cudaGetErrorString": (ctypes.c_char_p, [ctypes.c_int]),
        "cudaMalloc": (ctypes.c_int, [ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t]),
        "cudaFree": (ctypes.c_int, [ctypes.c_void_p]),
        "cudaIpcGetMemHandle": (ctypes.c_int, [ctypes.POINTER(IpcHandle), ctypes.c_void_p]),
        "cudaIpcOpenMemHandle": (ctypes.c_int, [ctypes.POINTER(ctypes.c_void_p), IpcHandle,
                                                ctypes.c_uint]),
        "cudaIpcCloseMemHandle": (ctypes.c_int, [ctypes.c_void_p]),
    }
    for name, (res, args) in sig.items():
        getattr(lib, name).restype = res
        getattr(lib, name).argtypes = args
    return lib


def _ok(lib: ctypes.CDLL, err: int) -> None:
    if err:
        raise RuntimeError(f"CUDART error: {lib.cudaGetErrorString(err).decode()}")


# --- the probe, the eligibility rule, the registration -----------------------------------------

def in_the_same_node_as_rank0() -> list[bool]:
    """Per rank: does it share /dev/shm (so: the node) with rank 0?"""
    magic = b"commsim-probe"
    name = [f"psm_{secrets.token_hex(6)}" if dist.get_rank() == 0 else None]
    seg = None
    if dist.get_rank() == 0:
        seg = shared_memory.SharedMemory(name=name[0], create=True, size=len(magic))
        seg.buf[:len(magic)] = magic
    dist.broadcast_object_list(name, src=0)
    same = dist.get_rank() == 0
    if dist.get_rank() != 0:
        try:
            peer = shared_memory.SharedMemory(name=name[0])
            same = bytes(peer.buf[:len(magic)]) == magic
            peer.close()
        except FileNotFoundError:
            same = False
    flags = [None] * dist.get_world_size()
    dist.all_gather_object(flags, same)
    dist.barrier()
    if seg is not None:
        seg.close()
        seg.unlink()
    return flags


def custom_allreduce_eligible(same_node: list[bool], fix: bool) -> bool:
    world = dist.get_world_size()
    if fix and not all(same_node):
        return False            # the fix: a group across nodes never takes node-local IPC
    if world == 2:
        return True             # the shortcut: a pair is taken as directly connected
    return all(same_node)


def register_graph_buffers(lib: ctypes.CDLL, buffers: list[ctypes.c_void_p]) -> list[list[int]]:
    """Export every graph buffer, all-gather the handles, open every peer's."""
    mine = []
    for buf in buffers:
        h = IpcHandle()
        _ok(lib, lib.cudaIpcGetMemHandle(ctypes.byref(h), buf))
        mine.append(bytes(h))
    everyone: list = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, mine)
    opened = []
    for peer, handles in enumerate(everyone):
        if peer == dist.get_rank():
            continue
        for blob in handles:
            ptr = ctypes.c_void_p()
            _ok(lib, lib.cudaIpcOpenMemHandle(ctypes.byref(ptr), IpcHandle.from_buffer_copy(blob), 1))
            opened.append(ptr.value)
    return [opened]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--fix", action="store_true", help="probe before the world-size-2 shortcut")
    ap.add_argument("--graphs", type=int, default=2, help="graph buffers per rank")
    args = ap.parse_args()
    dist.init_process_group(backend="cpu:gloo,cuda:nccl")   # vLLM keeps a gloo group for CPU work
    lib = _libcudart()
    count = ctypes.c_int()
    _ok(lib, lib.cudaGetDeviceCount(ctypes.byref(count)))
    _ok(lib, lib.cudaSetDevice(int(os.environ.get("LOCAL_RANK", "0")) % count.value))
    same_node = in_the_same_node_as_rank0()
    if custom_allreduce_eligible(same_node, args.fix):
        buffers = []
        for _ in range(args.graphs):
            p = ctypes.c_void_p()
            _ok(lib, lib.cudaMalloc(ctypes.byref(p), 1 << 16))
            buffers.append(p)
        opened = register_graph_buffers(lib, buffers)
        print(f"rank {dist.get_rank()}: custom all-reduce with {len(opened[0])} peer graph buffers")
        dist.barrier()
        for ptr in opened[0]:
            _ok(lib, lib.cudaIpcCloseMemHandle(ctypes.c_void_p(ptr)))
        dist.barrier()
        for p in buffers:
            _ok(lib, lib.cudaFree(p))
    else:
        t = torch.full((4,), float(dist.get_rank() + 1))
        dist.all_reduce(t)
        print(f"rank {dist.get_rank()}: custom all-reduce declined (same node: {same_node}); "
              f"regular all-reduce gives {t.tolist()}")
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
