"""CPU of a hosted 8-rank NCCL init + all-reduce (prints figures; no assertions).

    .venv/bin/python benchmarks/nccl_init.py [--machine hgx-h100-8] [--rounds 3]

A vLLM-style program (ctypes libnccl: ncclGetUniqueId on rank 0, the id over a
torch.distributed CPU group, ncclCommInitRank on every rank, one 1 MiB float32
ncclAllReduce) runs under `commsim exec` in inproc mode, where the eight ranks are greenlets
of this one interpreter: the process CPU (time.process_time) between a barrier before
ncclCommInitRank and one after the all-reduce is what the simulated NCCL's init and
all-reduce cost for all eight ranks together (bootstrap, topology through the driver, the
MNNVL check, NVLS, the P2P connections made at the all-reduce, the bytes over them).
Printed against the baseline it must beat: real NCCL's init on 8 GPUs, 0.66 s
(NVIDIA/nccl-tests#273), and with the NCCL_RUNTIME_CONNECT=0 variant (every connection at
init) beside it. The minimum over rounds is printed, as other processes share the machine.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import tempfile

from commsim.launch.config import RunConfig
from commsim.launch.run import execute

REAL_NCCL_INIT_8_GPUS_S = 0.66      # NVIDIA/nccl-tests#273

PROGRAM = r'''
import ctypes, json, os, time
import torch
import torch.distributed as dist

class UniqueId(ctypes.Structure):
    _fields_ = [("internal", ctypes.c_byte * 128)]

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
lib = ctypes.CDLL("libnccl.so.2")
lib.ncclCommInitRank.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_int, UniqueId, ctypes.c_int]
lib.ncclAllReduce.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int,
                              ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p]
x = torch.ones(1 << 18, device="cuda")
uid = UniqueId()
if rank == 0:
    lib.ncclGetUniqueId(ctypes.byref(uid))
blob = [bytes(uid)]
dist.broadcast_object_list(blob, src=0)
ctypes.memmove(ctypes.addressof(uid), blob[0], 128)
comm = ctypes.c_void_p()
dist.barrier()
t0 = time.process_time()
init = lib.ncclCommInitRank(ctypes.byref(comm), world, uid, rank)
ar = lib.ncclAllReduce(x.data_ptr(), x.data_ptr(), x.numel(), 7, 0, comm, None)
dist.barrier()
cpu = time.process_time() - t0
ok = init == 0 and ar == 0 and float(x[0].item()) == world
lib.ncclCommDestroy(comm)
print("RESULT " + json.dumps({"rank": rank, "cpu": cpu, "ok": ok}), flush=True)
'''


def one(machine: str, env: dict[str, str]) -> float:
    """The CPU seconds rank 0 saw for all ranks' init + all-reduce."""
    with tempfile.TemporaryDirectory() as d:
        prog = os.path.join(d, "nccl_init_prog.py")
        with open(prog, "w") as f:
            f.write(PROGRAM)
        saved = {k: os.environ.get(k) for k in env}
        os.environ.update(env)
        try:
            out = io.StringIO()
            v = execute(RunConfig(machine=machine, nproc_per_host=8, mode="inproc",
                                  command=[prog]), out=out, err=out)
        finally:
            for k, old in saved.items():
                if old is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = old
    if not v.ok:
        raise SystemExit(v.format() + out.getvalue())
    res = [json.loads(line.partition("RESULT ")[2]) for line in out.getvalue().splitlines()
           if "RESULT " in line]
    if not res or not all(r["ok"] for r in res):
        raise SystemExit(f"wrong all-reduce: {res}")
    return next(r["cpu"] for r in res if r["rank"] == 0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--machine", default="hgx-h100-8")
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    print(f"hosted 8-rank NCCL init + 1 MiB all-reduce on {a.machine}, CPU s (min of {a.rounds}):")
    print(f"  real NCCL init on 8 GPUs (baseline, nccl-tests#273): {REAL_NCCL_INIT_8_GPUS_S:.3f}")
    for label, env in (("runtime connect (default)", {}),
                       ("NCCL_RUNTIME_CONNECT=0", {"NCCL_RUNTIME_CONNECT": "0"})):
        best = min(one(a.machine, env) for _ in range(a.rounds))
        print(f"  simulated, {label}: {best:.3f}  ({best / REAL_NCCL_INIT_8_GPUS_S:.2f} x the baseline)")


if __name__ == "__main__":
    main()
