"""A rank that spawns its own workers (torch.multiprocessing.spawn): each worker must be a
process of the rank's simulated host (hostname, /dev/shm, environment, visible GPUs) with a
driver of its own; with --ipc a worker exports a cudaMalloc buffer through legacy IPC and its
parent rank opens it (same host: allowed)."""

import argparse
import ctypes
import os
import socket
from queue import Empty
from multiprocessing import shared_memory

import torch.distributed as dist
import torch.multiprocessing as mp


def _cudart():
    with open("/proc/self/maps") as f:
        path = next(ln.split()[-1] for ln in f if "libcudart" in ln)
    lib = ctypes.CDLL(path)
    lib.cudaGetErrorString.restype = ctypes.c_char_p
    return lib


class Handle(ctypes.Structure):
    _fields_ = [("internal", ctypes.c_byte * 128)]


def check(lib, err):
    if err:
        raise RuntimeError(f"CUDART error: {lib.cudaGetErrorString(err).decode()}")


def worker(index, queue, done, shm_name, ipc):
    lib = _cudart()
    n = ctypes.c_int()
    check(lib, lib.cudaGetDeviceCount(ctypes.byref(n)))
    seg = shared_memory.SharedMemory(name=shm_name)      # the parent's segment: same host
    seen = bytes(seg.buf[:4])
    seg.close()
    handle = None
    ptr = ctypes.c_void_p()
    check(lib, lib.cudaMalloc(ctypes.byref(ptr), 4096))
    if ipc:
        h = Handle()
        check(lib, lib.cudaIpcGetMemHandle(ctypes.byref(h), ptr))
        handle = bytes(h)
    queue.put((index, socket.gethostname(), os.environ["RANK"], n.value, seen, handle))
    done.wait(60)
    check(lib, lib.cudaFree(ptr))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ipc", action="store_true")
    ap.add_argument("--workers", type=int, default=2)
    args = ap.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    lib = _cudart()
    n = ctypes.c_int()
    check(lib, lib.cudaGetDeviceCount(ctypes.byref(n)))
    name = f"spawnprobe{rank}"
    seg = shared_memory.SharedMemory(name=name, create=True, size=4)
    seg.buf[:4] = b"ok%02d" % rank if rank < 100 else b"okxx"
    ctx = mp.get_context("spawn")
    queue, done = ctx.Queue(), ctx.Event()
    procs = mp.spawn(worker, args=(queue, done, name, args.ipc), nprocs=args.workers, join=False)
    got = []
    while len(got) < args.workers:
        try:
            got.append(queue.get(timeout=0.5))
        except Empty:
            procs.join(timeout=0)     # raises when a worker failed
    opened = []
    for index, host, wrank, count, seen, handle in sorted(got, key=lambda g: g[0]):
        assert host == socket.gethostname(), (host, socket.gethostname())
        assert wrank == str(rank), (wrank, rank)
        assert count == n.value, (count, n.value)
        assert seen == seg.buf[:4].tobytes(), seen
        if handle is not None:
            p = ctypes.c_void_p()
            check(lib, lib.cudaIpcOpenMemHandle(ctypes.byref(p), Handle.from_buffer_copy(handle), 1))
            opened.append(p)
    for p in opened:
        check(lib, lib.cudaIpcCloseMemHandle(p))
    done.set()
    procs.join()
    seg.close()
    seg.unlink()
    print(f"rank {rank} on {socket.gethostname()}: {args.workers} workers on the same host, "
          f"{len(opened)} IPC buffers opened")
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
