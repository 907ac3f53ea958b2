"""CUDA-graph capture around a custom all-reduce's buffers, the way serving stacks do it
(vLLM's style, written for commsim's tests): the IPC buffer is allocated and every peer's
handle opened *before* the capture; the capture (torch.cuda.graph on a side stream, GLOBAL
mode) records an in-place op and a new tensor from the graph's pool; after the capture the
graph's buffer is registered with the peers (its IPC handle exchanged and opened), the graph
is replayed and timed with CUDA events. One RESULT line per rank.

`--lazy` opens the peers' handles inside the capture instead (a lazy set-up at the first
captured op): on a GPU the open is refused (cudaErrorStreamCaptureUnsupported) and the
capture is invalidated, so the graph's exit raises cudaErrorStreamCaptureInvalidated.
`--all-reduce-inside` puts a torch.distributed all-reduce in the captured body, which
commsim's replay cannot re-run: refused, naming itself.
"""

import ctypes
import json
import os
import sys

import torch
import torch.distributed as dist

from ctypes_cudart import IpcHandle, check, libcudart

H2D = 1                             # cudaMemcpyKind
SIZE = 64 << 10


def share(lib: ctypes.CDLL, t: torch.Tensor, world: int) -> list:
    """(handle bytes, offset of the tensor in its allocation) of every rank's `t`."""
    from cuda.bindings import driver as cu
    err, base = cu.cuPointerGetAttribute(
        cu.CUpointer_attribute.CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, t.data_ptr())
    assert int(err) == 0, err
    h = IpcHandle()
    check(lib, lib.cudaIpcGetMemHandle(ctypes.byref(h), t.data_ptr()))
    everyone = [None] * world
    dist.all_gather_object(everyone, (bytes(h), t.data_ptr() - int(base)))
    return everyone


def open_peers(lib: ctypes.CDLL, everyone: list, rank: int) -> tuple[dict, list]:
    opened, mapped = {}, []
    for peer, (blob, off) in enumerate(everyone):
        if peer == rank:
            continue
        p = ctypes.c_void_p()
        check(lib, lib.cudaIpcOpenMemHandle(ctypes.byref(p), IpcHandle.from_buffer_copy(blob), 1))
        mapped.append(p.value)
        opened[peer] = p.value + off
    return opened, mapped


def main() -> None:
    lazy = "--lazy" in sys.argv[1:]
    dist.init_process_group(backend="nccl")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")) % torch.cuda.device_count())
    lib = libcudart()
    buf = torch.zeros(SIZE, dtype=torch.uint8, device="cuda")
    handles = share(lib, buf, world)
    opened, mapped = ({}, []) if lazy else open_peers(lib, handles, rank)
    dist.barrier()                     # every rank has opened its peers' buffers
    x = torch.full((4,), float(rank), device="cuda")
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g, stream=torch.cuda.Stream()):
        if lazy:
            opened, mapped = open_peers(lib, handles, rank)    # refused inside the capture
        x.add_(world)
        if "--all-reduce-inside" in sys.argv[1:]:
            dist.all_reduce(x)          # NCCL would capture it; commsim refuses, naming it
        out = x * 2
    after_capture = x.cpu().tolist()
    # Register the graph's buffer with the peers: each writes a marker into its right
    # neighbour's `out` through the IPC mapping.
    graph_peers, graph_mapped = open_peers(lib, share(lib, out, world), rank)
    right = (rank + 1) % world
    marker = torch.full((1,), 200.0 + rank)
    check(lib, lib.cudaMemcpy(graph_peers[right], marker.data_ptr(), 4, H2D))
    dist.barrier()
    peer_seen = out[0].item()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    g.replay()
    g.replay()
    end.record()
    end.synchronize()
    dist.barrier()
    for p in mapped + graph_mapped:
        check(lib, lib.cudaIpcCloseMemHandle(p))
    dist.barrier()
    print("RESULT " + json.dumps({"rank": rank, "after_capture": after_capture,
                                  "after_replay": x.cpu().tolist(), "peer_seen": peer_seen,
                                  "out": out.cpu().tolist(), "graph_ms": start.elapsed_time(end)}))


if __name__ == "__main__":
    main()
