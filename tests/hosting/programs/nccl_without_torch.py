"""A PyTorch-free NCCL user: mpi4py carries the unique id, libcudart (found in
/proc/self/maps, as CUDA wrappers find it) allocates and copies, libnccl all-reduces raw
device pointers. Run under `--launcher mpirun`; prints one RESULT line per rank."""

import ctypes
import json
import os

from mpi4py import MPI


class UniqueId(ctypes.Structure):
    _fields_ = [("internal", ctypes.c_char * 128)]


def main() -> None:
    world = MPI.COMM_WORLD
    rank, size = world.Get_rank(), world.Get_size()
    cudart_path = next(line.split()[-1] for line in open("/proc/self/maps") if "libcudart" in line)
    rt = ctypes.CDLL(cudart_path)
    assert rt.cudaSetDevice(int(os.environ["OMPI_COMM_WORLD_LOCAL_RANK"])) == 0
    nccl = ctypes.CDLL("libnccl.so.2")
    nccl.ncclCommInitRank.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_int, UniqueId,
                                      ctypes.c_int]
    nccl.ncclAllReduce.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t,
                                   ctypes.c_int, ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p]
    uid = UniqueId()
    if rank == 0:
        assert nccl.ncclGetUniqueId(ctypes.byref(uid)) == 0
    uid = UniqueId.from_buffer_copy(world.bcast(bytes(uid) if rank == 0 else None, root=0))
    comm = ctypes.c_void_p()
    init = nccl.ncclCommInitRank(ctypes.byref(comm), size, uid, rank)
    n = 16
    dev = ctypes.c_void_p()
    assert rt.cudaMalloc(ctypes.byref(dev), 4 * n) == 0
    host = (ctypes.c_float * n)(*[float(rank + 1 + i) for i in range(n)])
    assert rt.cudaMemcpy(dev, host, 4 * n, 1) == 0            # cudaMemcpyHostToDevice
    reduce = nccl.ncclAllReduce(dev, dev, n, 7, 2, comm, None)  # ncclFloat32, ncclMax
    assert rt.cudaMemcpy(host, dev, 4 * n, 2) == 0            # cudaMemcpyDeviceToHost
    rt.cudaFree(dev)
    nccl.ncclCommDestroy(comm)
    print("RESULT " + json.dumps({"rank": rank, "codes": [init, reduce], "max": list(host)}),
          flush=True)


if __name__ == "__main__":
    main()
