"""A peer-memory set-up in the style of TensorRT-LLM's `_ipc_utils.py` (IpcMemory), launched
by mpirun.

What such code does, in this program's own words: a Mapping turns the MPI rank into tensor-
and pipeline-parallel coordinates, assuming 8 GPUs per node unless told otherwise; the
buffer goes over legacy CUDA IPC when the tensor-parallel group fits in one node
(`tp_size <= gpus_per_node`); the tensor-parallel communicator is `COMM_WORLD.Split(pp rank,
tp rank)`; every rank cudaMallocs its buffer, all-gathers the 64 bytes of its
cudaIpcMemHandle_t over that communicator, and opens every peer's handle.

On an 8-GPU HGX host that works. On two GB200 trays with 4 ranks each, the 8 ranks are one
tensor-parallel group that "fits in a node of 8", but the trays are two OS instances: a
legacy IPC handle names nothing on the other tray, and every rank fails in
cudaIpcOpenMemHandle with cudaErrorInvalidResourceHandle.

    commsim exec --launcher mpirun --machine gb200-nvl72:2 --nproc-per-host 4 -- python examples/trtllm_style_ipc_memory.py
    ... --fix   learns gpus_per_node from MPI itself, the size of
                COMM_WORLD.Split_type(COMM_TYPE_SHARED) (the ranks that share this host's
                memory), so a group spanning two trays declines IPC (as one whose GPUs lack
                peer access does); the run is clean.

It uses cuda-python's runtime module (`cuda.bindings.runtime`, or the 12.x name `cuda.cudart`
where only that exists) and mpi4py only; run it under a real
`mpirun -np 8 python trtllm_style_ipc_memory.py` the same way.
"""

from __future__ import annotations

import argparse
import ctypes

try:
    from cuda.bindings import runtime as cudart
except ImportError:          # cuda-python before 12.6.1
    from cuda import cudart
from mpi4py import MPI

IPC_HANDLE_BYTES = 64          # CUDA_IPC_HANDLE_SIZE
BUFFER_BYTES = 1 << 20


def check(result: tuple) -> object:
    """The value of a cuda-python call, or an error naming the CUDA error."""
    err, *rest = result
    if err != cudart.cudaError_t.cudaSuccess:
        name = cudart.cudaGetErrorName(err)[1].decode()
        raise RuntimeError(f"CUDA error: {name}")
    return rest[0] if len(rest) == 1 else tuple(rest)


class Mapping:
    """Parallel coordinates of a rank: tensor-parallel groups of consecutive ranks, nodes of
    `gpus_per_node` consecutive ranks."""

    def __init__(self, world_size: int, rank: int, tp_size: int, gpus_per_node: int = 8) -> None:
        self.world_size = world_size
        self.rank = rank
        self.tp_size = tp_size
        self.pp_size = world_size // tp_size
        self.gpus_per_node = gpus_per_node

    @property
    def tp_rank(self) -> int:
        return self.rank % self.tp_size

    @property
    def pp_rank(self) -> int:
        return self.rank // self.tp_size

    @property
    def node_rank(self) -> int:
        return self.rank // self.gpus_per_node

    def tp_fits_in_node(self) -> bool:
        return self.tp_size <= self.gpus_per_node


class PeerMemory:
    """A buffer on every GPU of the tensor-parallel group and every peer's pointer to it."""

    def __init__(self, mapping: Mapping, size: int, peers_reachable: bool = True) -> None:
        self.mapping = mapping
        self.use_ipc = mapping.tp_fits_in_node() and peers_reachable
        self.local_ptr = 0
        self.peer_ptrs: list[int] = []
        if self.use_ipc:
            self.open(size)

    def open(self, size: int) -> None:
        m = self.mapping
        comm = MPI.COMM_WORLD.Split(m.pp_rank, m.tp_rank)
        self.local_ptr = check(cudart.cudaMalloc(size))
        check(cudart.cudaMemset(self.local_ptr, 0, size))
        handle = check(cudart.cudaIpcGetMemHandle(self.local_ptr))
        # cuda-python 13 exposes the handle's bytes only through its address.
        mine = ctypes.string_at(handle.getPtr(), IPC_HANDLE_BYTES)
        everyone = comm.allgather(mine)
        for peer, blob in enumerate(everyone):
            if peer == m.tp_rank:
                self.peer_ptrs.append(self.local_ptr)
                continue
            theirs = cudart.cudaIpcMemHandle_t()
            ctypes.memmove(theirs.getPtr(), blob, IPC_HANDLE_BYTES)
            ptr = check(cudart.cudaIpcOpenMemHandle(theirs, cudart.cudaIpcMemLazyEnablePeerAccess))
            self.peer_ptrs.append(int(ptr))
        comm.Free()

    def close_peers(self) -> None:
        for peer, ptr in enumerate(self.peer_ptrs):
            if peer != self.mapping.tp_rank:
                check(cudart.cudaIpcCloseMemHandle(ptr))

    def free(self) -> None:
        if self.local_ptr:
            check(cudart.cudaFree(self.local_ptr))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--fix", action="store_true",
                    help="derive gpus_per_node from MPI's shared-memory split")
    ap.add_argument("--tp", type=int, default=0, help="tensor-parallel size (default: all ranks)")
    args = ap.parse_args()
    world = MPI.COMM_WORLD
    rank, size = world.Get_rank(), world.Get_size()
    device = rank % check(cudart.cudaGetDeviceCount())
    check(cudart.cudaSetDevice(device))
    gpus_per_node, reachable = 8, True
    if args.fix:
        node = world.Split_type(MPI.COMM_TYPE_SHARED)
        gpus_per_node = node.Get_size()
        # and every GPU of the node must reach every other one (what a can-access-peer
        # check before opening IPC handles asks), agreed by all ranks
        mine = all(check(cudart.cudaDeviceCanAccessPeer(device, d))
                   for d in node.allgather(device) if d != device)
        reachable = world.allreduce(mine, op=MPI.LAND)
        node.Free()
    mapping = Mapping(size, rank, args.tp or size, gpus_per_node)
    mem = PeerMemory(mapping, BUFFER_BYTES, reachable)
    world.Barrier()      # every peer has mapped every buffer before any is freed
    if mem.use_ipc:
        print(f"rank {rank} on {MPI.Get_processor_name()}: IPC memory of {len(mem.peer_ptrs)} "
              f"ranks ready")
    else:
        why = (f"spans nodes of {mapping.gpus_per_node}" if not mapping.tp_fits_in_node()
               else "has GPUs without peer access")
        print(f"rank {rank} on {MPI.Get_processor_name()}: tensor-parallel group of "
              f"{mapping.tp_size} {why}: IPC declined")
    mem.close_peers()
    world.Barrier()      # every peer has closed its mapping of this buffer before it is freed
    mem.free()


if __name__ == "__main__":
    main()
