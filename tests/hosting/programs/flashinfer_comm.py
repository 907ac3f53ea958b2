"""FlashInfer's communication set-up as a serving stack calls it, unmodified (needs the
installed flashinfer-python): `import flashinfer.comm`, then one step named by argv[1]:
- `import`: nothing more;
- `jit`: load the trtllm_comm kernels as `trtllm_ar.py` does (`gen_trtllm_comm_module()
  .build_and_load()`);
- `workspace BACKEND [COMM]`: `create_allreduce_fusion_workspace(backend=BACKEND, ...)` over
  the default process group, then destroy it; COMM `torch` passes FlashInfer's own
  `TorchDistBackend()` as the handle-exchange backend (as vLLM's FlashInfer all-reduce does),
  else FlashInfer's default (mpi4py's COMM_WORLD).
One RESULT line per rank: the step's outcome (ok, or the exception's type and text), and the
compiler or build processes (nvcc, ninja, cicc, ptxas) left among this process's children.
"""

import json
import os
import sys

import torch
import torch.distributed as dist

import flashinfer
import flashinfer.comm as comm

COMPILERS = {"nvcc", "ninja", "cicc", "ptxas", "cudafe++"}


def compiler_children() -> list[str]:
    me, found = os.getpid(), []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            with open(f"/proc/{pid}/comm") as f:
                name = f.read().strip()
        except OSError:
            continue
        if int(fields[1]) == me and name in COMPILERS:
            found.append(name)
    return found


def step(what: str, args: list[str]) -> None:
    if what == "jit":
        from flashinfer.jit.comm import gen_trtllm_comm_module
        gen_trtllm_comm_module().build_and_load()
    elif what == "workspace":
        backend = None
        if args[1:] == ["torch"]:
            from flashinfer.comm.mnnvl import TorchDistBackend
            backend = TorchDistBackend()
        ws = comm.create_allreduce_fusion_workspace(
            backend=args[0], world_size=dist.get_world_size(), rank=dist.get_rank(),
            max_token_num=128, hidden_dim=1024, dtype=torch.bfloat16, comm_backend=backend)
        ws.destroy()


def main() -> None:
    what, args = sys.argv[1], sys.argv[2:]
    rank = int(os.environ.get("RANK", 0))
    if what == "workspace":
        dist.init_process_group(backend="nccl")
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    try:
        step(what, args)
        outcome = "ok"
    except Exception as e:                   # reported, judged by the test
        outcome = f"{type(e).__name__}: {e}"
        if os.environ.get("SHOW_TRACEBACK"):
            import traceback
            traceback.print_exc()
    print("RESULT " + json.dumps({"rank": rank, "version": flashinfer.__version__,
                                  "outcome": outcome, "compilers": compiler_children()}))
    if dist.is_initialized():
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
