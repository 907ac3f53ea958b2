"""A serving-stack-style NCCL wrapper, as vLLM's pynccl is written: libnccl loaded with ctypes
(the name chosen from torch.version.cuda), functions declared with restype/argtypes, a
128-byte unique id made on rank 0 and broadcast over a torch.distributed CPU group, a
communicator per rank on its LOCAL_RANK device, and collectives on CUDA tensors by
data_ptr() on the current stream. Every non-zero result becomes
RuntimeError("NCCL error: <ncclGetErrorString>").

    python pynccl_allreduce.py [--misuse] [--check]

Prints one RESULT line per rank. --misuse passes an unknown datatype to ncclAllReduce after
a good all-reduce (the wrapper's check raises). --check: a rank whose numbers differ from the
reference exits 1 naming them, so a verdict alone says whether every rank's bytes were right
(the mode-agreement harness compares verdicts, not output).
"""

import ctypes
import json
import os
import sys

import torch
import torch.distributed as dist

Result = ctypes.c_int
Comm = ctypes.c_void_p
Stream = ctypes.c_void_p
Buffer = ctypes.c_void_p


class UniqueId(ctypes.Structure):
    _fields_ = [("internal", ctypes.c_byte * 128)]


DTYPE = {torch.float32: 7, torch.float16: 6, torch.bfloat16: 9, torch.int32: 2, torch.int64: 4}
SUM, MAX = 0, 2

SIGNATURES = {
    "ncclGetErrorString": (ctypes.c_char_p, [Result]),
    "ncclGetVersion": (Result, [ctypes.POINTER(ctypes.c_int)]),
    "ncclGetUniqueId": (Result, [ctypes.POINTER(UniqueId)]),
    "ncclCommInitRank": (Result, [ctypes.POINTER(Comm), ctypes.c_int, UniqueId, ctypes.c_int]),
    "ncclAllReduce": (Result, [Buffer, Buffer, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                               Comm, Stream]),
    "ncclAllGather": (Result, [Buffer, Buffer, ctypes.c_size_t, ctypes.c_int, Comm, Stream]),
    "ncclReduceScatter": (Result, [Buffer, Buffer, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                                   Comm, Stream]),
    "ncclBroadcast": (Result, [Buffer, Buffer, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                               Comm, Stream]),
    "ncclSend": (Result, [Buffer, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, Comm, Stream]),
    "ncclRecv": (Result, [Buffer, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, Comm, Stream]),
    "ncclGroupStart": (Result, []),
    "ncclGroupEnd": (Result, []),
    "ncclCommDestroy": (Result, [Comm]),
}


class Nccl:
    def __init__(self) -> None:
        if torch.version.cuda is None:
            raise ValueError("NCCL needs a CUDA build of torch")
        lib = ctypes.CDLL(os.environ.get("NCCL_SO_PATH", "libnccl.so.2"))
        self.fn = {}
        for name, (restype, argtypes) in SIGNATURES.items():
            f = getattr(lib, name)
            f.restype, f.argtypes = restype, argtypes
            self.fn[name] = f

    def check(self, result: int) -> None:
        if result != 0:
            text = self.fn["ncclGetErrorString"](result).decode()
            raise RuntimeError(f"NCCL error: {text}")

    def call(self, name: str, *args) -> None:
        self.check(self.fn[name](*args))

    def version(self) -> str:
        v = ctypes.c_int()
        self.call("ncclGetVersion", ctypes.byref(v))
        s = str(v.value)
        return ".".join(str(int(x)) for x in (s[0], s[1:3], s[3:]))


class Communicator:
    def __init__(self, nccl: Nccl, group, device: torch.device) -> None:
        self.nccl = nccl
        self.rank, self.size = dist.get_rank(group), dist.get_world_size(group)
        uid = UniqueId()
        if self.rank == 0:
            nccl.call("ncclGetUniqueId", ctypes.byref(uid))
        blob = torch.ByteTensor(list(uid.internal))
        dist.broadcast(blob, src=dist.get_process_group_ranks(group)[0], group=group)
        for i, b in enumerate(blob.tolist()):
            uid.internal[i] = b
        self.device = device
        self.comm = Comm()
        with torch.cuda.device(device):
            nccl.call("ncclCommInitRank", ctypes.byref(self.comm), self.size, uid, self.rank)
        warm = torch.zeros(1, device=device)
        self.all_reduce(warm)
        torch.cuda.current_stream().synchronize()

    def _stream(self) -> Stream:
        return Stream(torch.cuda.current_stream().cuda_stream)

    def all_reduce(self, t: torch.Tensor, out: torch.Tensor | None = None, op: int = SUM) -> torch.Tensor:
        out = t if out is None else out
        self.nccl.call("ncclAllReduce", Buffer(t.data_ptr()), Buffer(out.data_ptr()), t.numel(),
                       DTYPE[t.dtype], op, self.comm, self._stream())
        return out

    def all_gather(self, out: torch.Tensor, t: torch.Tensor) -> None:
        self.nccl.call("ncclAllGather", Buffer(t.data_ptr()), Buffer(out.data_ptr()), t.numel(),
                       DTYPE[t.dtype], self.comm, self._stream())

    def reduce_scatter(self, out: torch.Tensor, t: torch.Tensor) -> None:
        self.nccl.call("ncclReduceScatter", Buffer(t.data_ptr()), Buffer(out.data_ptr()),
                       out.numel(), DTYPE[t.dtype], SUM, self.comm, self._stream())

    def broadcast(self, t: torch.Tensor, src: int) -> None:
        self.nccl.call("ncclBroadcast", Buffer(t.data_ptr()), Buffer(t.data_ptr()), t.numel(),
                       DTYPE[t.dtype], src, self.comm, self._stream())

    def ring_shift(self, t: torch.Tensor) -> torch.Tensor:
        got = torch.empty_like(t)
        self.nccl.call("ncclGroupStart")
        self.nccl.call("ncclSend", Buffer(t.data_ptr()), t.numel(), DTYPE[t.dtype],
                       (self.rank + 1) % self.size, self.comm, self._stream())
        self.nccl.call("ncclRecv", Buffer(got.data_ptr()), got.numel(), DTYPE[got.dtype],
                       (self.rank - 1) % self.size, self.comm, self._stream())
        self.nccl.call("ncclGroupEnd")
        return got


def expected(rank: int, n: int, version: str) -> dict:
    """Each rank's RESULT under NCCL `version` when every collective moved the right bytes."""
    return {"rank": rank, "version": version, "torch_cuda": "13.0", "all_reduce_ok": True,
            "bf16_max": 0.5 * n, "all_gather": [q for q in range(n) for _ in range(4)],
            "reduce_scatter": [n * 2 * rank, n * (2 * rank + 1)],
            "broadcast": [float(n - 1)] * 3, "ring": [(rank - 1) % n] * 5}


def main() -> None:
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device("cuda", int(os.environ["LOCAL_RANK"]))
    torch.cuda.set_device(device)
    nccl = Nccl()
    comm = Communicator(nccl, dist.group.WORLD, device)
    res = {"rank": rank, "version": nccl.version(), "torch_cuda": torch.version.cuda}

    x = torch.arange(1024, dtype=torch.float32, device=device) + rank
    comm.all_reduce(x)
    expect = torch.arange(1024, dtype=torch.float32) * world + sum(range(world))
    res["all_reduce_ok"] = bool(torch.equal(x.cpu(), expect))

    h = torch.full((64,), 0.5 * (rank + 1), dtype=torch.bfloat16, device=device)
    hm = torch.empty_like(h)
    comm.all_reduce(h, hm, MAX)
    res["bf16_max"] = hm[0].item()

    parts = torch.empty(world * 4, dtype=torch.int32, device=device)
    comm.all_gather(parts, torch.full((4,), rank, dtype=torch.int32, device=device))
    res["all_gather"] = parts.cpu().tolist()

    mine = torch.empty(2, dtype=torch.int64, device=device)
    comm.reduce_scatter(mine, torch.arange(2 * world, dtype=torch.int64, device=device))
    res["reduce_scatter"] = mine.cpu().tolist()

    b = torch.full((3,), float(rank), device=device)
    comm.broadcast(b, world - 1)
    res["broadcast"] = b.cpu().tolist()

    res["ring"] = comm.ring_shift(torch.full((5,), rank, dtype=torch.int32, device=device)).cpu().tolist()

    if "--misuse" in sys.argv:
        bad = torch.zeros(4, device=device)
        nccl.check(nccl.fn["ncclAllReduce"](Buffer(bad.data_ptr()), Buffer(bad.data_ptr()), 4,
                                            99, SUM, comm.comm, comm._stream()))
    nccl.call("ncclCommDestroy", comm.comm)
    print("RESULT " + json.dumps(res), flush=True)
    dist.destroy_process_group()
    want = expected(rank, world, res["version"])
    if "--check" in sys.argv and res != want:
        wrong = {k: (res.get(k), v) for k, v in want.items() if res.get(k) != v}
        sys.exit(f"rank {rank}: wrong results (got, want): {wrong}")


if __name__ == "__main__":
    main()
