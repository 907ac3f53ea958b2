"""A fusion-workspace set-up in the style of FlashInfer's `comm/cuda_ipc.py` (seed 000).

What the real code does, and this program does in its own words: a ctypes wrapper around
libcudart is built when the module is imported (the library is found by name in
/proc/self/maps, where `import torch` put it), every rank cudaMallocs its share of the
workspace, the legacy IPC handles are exchanged with `all_gather_object`, and every rank opens
every peer's handle with cudaIpcOpenMemHandle. On one host that works. On two GB200 trays
(one NVLink domain, two OS instances) a legacy IPC handle names nothing on the other tray
and the open fails: `RuntimeError: CUDART error: invalid resource handle`.

    commsim exec --machine gb200-nvl72:2 --nproc-per-host 4 -- python examples/flashinfer_style_ipc_workspace.py
    ... --fix   declines the IPC workspace unless every peer is on this host with peer access
                (what sglang does after flashinfer#2006: no legacy-IPC fusion across nodes),
                so the run is clean.

Run it directly on a real multi-GPU host under torchrun: it uses only ctypes, torch.distributed
and the environment torchrun sets.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import socket
from dataclasses import dataclass
from typing import Any

import torch  # noqa: F401  (a CUDA build of torch loads libcudart; the wrapper finds it)
import torch.distributed as dist

cudaError_t = ctypes.c_int
IPC_LAZY_ENABLE_PEER_ACCESS = 1


class cudaIpcMemHandle_t(ctypes.Structure):
    _fields_ = [("internal", ctypes.c_byte * 128)]


@dataclass
class Exported:
    name: str
    restype: Any
    argtypes: list


def loaded_library_path(fragment: str) -> str | None:
    """The path of a shared library this process has mapped whose name contains `fragment`."""
    with open("/proc/self/maps") as maps:
        for line in maps:
            fields = line.split()
            if len(fields) >= 6 and fragment in os.path.basename(fields[-1]):
                return fields[-1]
    return None


class CudaRuntime:
    """The few libcudart calls a workspace needs, loaded through ctypes."""

    EXPORTS = [
        Exported("cudaSetDevice", cudaError_t, [ctypes.c_int]),
        Exported("cudaGetDeviceCount", cudaError_t, [ctypes.POINTER(ctypes.c_int)]),
        Exported("cudaDeviceSynchronize", cudaError_t, []),
        Exported("cudaDeviceCanAccessPeer", cudaError_t,
                 [ctypes.POINTER(ctypes.c_int), ctypes.c_int, ctypes.c_int]),
        Exported("cudaGetErrorString", ctypes.c_char_p, [cudaError_t]),
        Exported("cudaMalloc", cudaError_t, [ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t]),
        Exported("cudaFree", cudaError_t, [ctypes.c_void_p]),
        Exported("cudaMemset", cudaError_t, [ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t]),
        Exported("cudaIpcGetMemHandle", cudaError_t,
                 [ctypes.POINTER(cudaIpcMemHandle_t), ctypes.c_void_p]),
        Exported("cudaIpcOpenMemHandle", cudaError_t,
                 [ctypes.POINTER(ctypes.c_void_p), cudaIpcMemHandle_t, ctypes.c_uint]),
        Exported("cudaIpcCloseMemHandle", cudaError_t, [ctypes.c_void_p]),
    ]

    def __init__(self) -> None:
        path = loaded_library_path("libcudart")
        if path is None:
            raise RuntimeError("libcudart is not loaded in this process")
        self.lib = ctypes.CDLL(path)
        self.fn = {}
        for e in self.EXPORTS:
            f = getattr(self.lib, e.name)
            f.restype, f.argtypes = e.restype, e.argtypes
            self.fn[e.name] = f

    def check(self, result: int) -> None:
        if result != 0:
            text = self.fn["cudaGetErrorString"](result)
            raise RuntimeError(f"CUDART error: {text.decode()}")

    def set_device(self, device: int) -> None:
        self.check(self.fn["cudaSetDevice"](device))

    def device_count(self) -> int:
        n = ctypes.c_int()
        self.check(self.fn["cudaGetDeviceCount"](ctypes.byref(n)))
        return n.value

    def can_access_peer(self, device: int, peer: int) -> bool:
        ok = ctypes.c_int()
        self.check(self.fn["cudaDeviceCanAccessPeer"](ctypes.byref(ok), device, peer))
        return bool(ok.value)

    def malloc(self, size: int) -> ctypes.c_void_p:
        ptr = ctypes.c_void_p()
        self.check(self.fn["cudaMalloc"](ctypes.byref(ptr), size))
        return ptr

    def free(self, ptr: ctypes.c_void_p) -> None:
        self.check(self.fn["cudaFree"](ptr))

    def memset(self, ptr: ctypes.c_void_p, value: int, size: int) -> None:
        self.check(self.fn["cudaMemset"](ptr, value, size))

    def ipc_handle(self, ptr: ctypes.c_void_p) -> cudaIpcMemHandle_t:
        handle = cudaIpcMemHandle_t()
        self.check(self.fn["cudaIpcGetMemHandle"](ctypes.byref(handle), ptr))
        return handle

    def ipc_open(self, handle: cudaIpcMemHandle_t) -> ctypes.c_void_p:
        ptr = ctypes.c_void_p()
        self.check(self.fn["cudaIpcOpenMemHandle"](ctypes.byref(ptr), handle,
                                                   IPC_LAZY_ENABLE_PEER_ACCESS))
        return ptr

    def ipc_close(self, ptr: ctypes.c_void_p) -> None:
        self.check(self.fn["cudaIpcCloseMemHandle"](ptr))


cudart = CudaRuntime()     # built at import, as the real module does


def create_shared_buffer(size: int, group: Any = None) -> list[int]:
    """This rank's buffer plus every peer's, opened through legacy IPC: pointers by rank."""
    rank, world = dist.get_rank(group), dist.get_world_size(group)
    mine = cudart.malloc(size)
    cudart.memset(mine, 0, size)
    handle = bytes(cudart.ipc_handle(mine))     # 128 bytes, picklable
    handles: list[Any] = [None] * world
    dist.all_gather_object(handles, handle, group=group)
    pointers = []
    for peer, blob in enumerate(handles):
        if peer == rank:
            pointers.append(mine.value)
        else:
            pointers.append(cudart.ipc_open(cudaIpcMemHandle_t.from_buffer_copy(blob)).value)
    return pointers


def free_shared_buffer(pointers: list[int], group: Any = None) -> None:
    rank = dist.get_rank(group)
    for peer, ptr in enumerate(pointers):
        if peer != rank:
            cudart.ipc_close(ctypes.c_void_p(ptr))
    dist.barrier(group=group)       # no peer maps our buffer any more
    cudart.free(ctypes.c_void_p(pointers[rank]))


def ipc_reaches_every_peer(device: int, group: Any = None) -> bool:
    """The fix: legacy IPC needs every peer on this host (handles do not cross OS instances)
    and peer access to its GPU; all ranks vote, so all take the same path."""
    where: list[Any] = [None] * dist.get_world_size(group)
    dist.all_gather_object(where, (socket.gethostname(), device), group=group)
    me = where[dist.get_rank(group)]
    ok = all(host == me[0] and (dev == device or cudart.can_access_peer(device, dev))
             for host, dev in where)
    votes: list[Any] = [None] * len(where)
    dist.all_gather_object(votes, ok, group=group)
    return all(votes)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--fix", action="store_true",
                    help="decline the legacy-IPC workspace unless IPC reaches every peer")
    ap.add_argument("--size", type=int, default=1 << 20, help="bytes per workspace buffer")
    args = ap.parse_args()
    dist.init_process_group(backend="cpu:gloo,cuda:nccl")   # handles and votes travel by gloo
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    device = local_rank % cudart.device_count()
    cudart.set_device(device)
    if args.fix and not ipc_reaches_every_peer(device):
        print(f"rank {dist.get_rank()}: allreduce fusion disabled (a peer is on another host "
              f"or without peer access: legacy IPC cannot reach it)")
    else:
        # A fusion workspace: the data buffer, the barrier flags and the lamport buffer.
        workspace = [create_shared_buffer(args.size), create_shared_buffer(4096),
                     create_shared_buffer(args.size)]
        print(f"rank {dist.get_rank()}: IPC workspace of {len(workspace)} buffers x "
              f"{dist.get_world_size()} ranks ready")
        cudart.fn["cudaDeviceSynchronize"]()
        for pointers in workspace:
            free_shared_buffer(pointers)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
