"""FlashInfer's communication set-up as a serving stack calls it, unmodified (needs the
installed flashinfer-python): `import flashinfer.comm`, then one step named by argv[1]:
- `import`: nothing more;
- `jit GEN...`: load each named JIT module as `trtllm_ar.py` loads trtllm_comm
  (`flashinfer.jit.comm.<GEN>().build_and_load()`), one outcome per module joined by " | ";
- `workspace BACKEND [COMM]`: `create_allreduce_fusion_workspace(backend=BACKEND, ...)` over
  the default process group, then destroy it; COMM `torch` passes FlashInfer's own
  `TorchDistBackend()` as the handle-exchange backend (as vLLM's FlashInfer all-reduce does),
  else FlashInfer's default (mpi4py's COMM_WORLD);
- `fusion BACKEND [skipN]`: that workspace (TorchDistBackend), then `allreduce_fusion` as SGLang
  and vLLM call it, three rounds of kAllReduce (the Lamport buffers rotate through all
  three; with trtllm a fourth, two-shot) and one of kARResidualRMSNorm, each checked here against a torch reference of
  every rank's input; the outcome names the backend the workspace got and the first
  mismatch, then destroy; with `skipN`, rank N creates the workspace but never calls
  allreduce_fusion;
- `direct`: `trtllm_create_ipc_workspace_for_all_reduce_fusion` as older callers use it;
- `symm`: FlashInfer's `SymmDeviceMemory` over TorchDistBackend (the handle type its exchanger
  picks: FABRIC where NVML reports the fabric, else POSIX fds); each rank writes rank + 1 into
  its own buffer and reads every peer's through its unicast pointer (FlashInfer's
  `create_tensor_from_cuda_memory`); the outcome names the handle type and the values read.
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


TOKENS, HIDDEN = 8, 256


def rank_input(rank: int, rnd: int) -> torch.Tensor:
    """Rank `rank`'s input of round `rnd`: small integers (exact in bfloat16 and in any
    order of adds), a different pattern per rank and round."""
    i = torch.arange(TOKENS * HIDDEN, dtype=torch.float32).view(TOKENS, HIDDEN)
    return ((i * (rank + 3) + 5 * rnd) % 13 - 6).to(torch.bfloat16)


def residual_rmsnorm_outcome(backend: str, world: int, residual: torch.Tensor,
                             gamma: torch.Tensor, res_out: torch.Tensor,
                             norm_out: torch.Tensor) -> str:
    """"ok BACKEND" when kARResidualRMSNorm's outputs over every rank's round-5 input match a
    torch reference (eps 1e-6), else the first output that does not."""
    total = sum(rank_input(r, 5).float() for r in range(world)).to(torch.bfloat16)
    want_res = (total.float() + residual.cpu().float()).to(torch.bfloat16)
    v = want_res.float()
    want_norm = (v * torch.rsqrt((v * v).mean(-1, keepdim=True) + 1e-6)
                 * gamma.cpu().float()).to(torch.bfloat16)
    if not torch.equal(res_out.cpu(), want_res):
        return f"{backend}: kARResidualRMSNorm residual_out differs from the reference"
    if not torch.allclose(norm_out.cpu().float(), want_norm.float(), rtol=1e-2, atol=1e-2):
        return f"{backend}: kARResidualRMSNorm norm_out differs from the reference"
    return f"ok {backend}"


def fusion(backend: str, skip: str = "") -> str:
    from flashinfer.comm import AllReduceFusionPattern as P
    from flashinfer.comm.mnnvl import TorchDistBackend
    ws_size, me = dist.get_world_size(), dist.get_rank()
    ws = comm.create_allreduce_fusion_workspace(
        backend=backend, world_size=ws_size, rank=me, max_token_num=TOKENS, hidden_dim=HIDDEN,
        dtype=torch.bfloat16, comm_backend=TorchDistBackend())
    got = ws.backend
    try:
        if skip == f"skip{me}":
            return f"{got}: skipped allreduce_fusion"
        for rnd in range(4 if got == "trtllm" else 3):
            x = rank_input(me, rnd).cuda()
            # trtllm's fourth round takes the two-shot kernel (comm buffers, flag barrier).
            out = comm.allreduce_fusion(input=x, workspace=ws, pattern=P.kAllReduce,
                                        output=torch.empty_like(x),
                                        use_oneshot=False if rnd == 3 else None)
            want = sum(rank_input(r, rnd).float() for r in range(ws_size)).to(torch.bfloat16)
            if not torch.equal(out.cpu(), want):
                return f"{got}: kAllReduce round {rnd} differs from the reference"
        x = rank_input(me, 5).cuda()
        residual = (rank_input(0, 7) / 4).cuda()
        gamma = torch.linspace(0.5, 1.5, HIDDEN).to(torch.bfloat16).cuda()
        res_out, norm_out = torch.empty_like(x), torch.empty_like(x)
        comm.allreduce_fusion(input=x, workspace=ws, pattern=P.kARResidualRMSNorm,
                              residual_in=residual, residual_out=res_out, norm_out=norm_out,
                              rms_gamma=gamma, rms_eps=1e-6)
        return residual_rmsnorm_outcome(got, ws_size, residual, gamma, res_out, norm_out)
    finally:
        ws.destroy()


def step(what: str, args: list[str]) -> str:
    if what == "jit":
        import flashinfer.jit.comm as jit_comm
        outcomes = []
        for gen in args:
            try:
                getattr(jit_comm, gen)().build_and_load()
                outcomes.append("ok")
            except Exception as e:          # reported, judged by the test
                outcomes.append(f"{type(e).__name__}: {e}")
        return " | ".join(outcomes)
    elif what == "workspace":
        backend = None
        if args[1:] == ["torch"]:
            from flashinfer.comm.mnnvl import TorchDistBackend
            backend = TorchDistBackend()
        ws = comm.create_allreduce_fusion_workspace(
            backend=args[0], world_size=dist.get_world_size(), rank=dist.get_rank(),
            max_token_num=128, hidden_dim=1024, dtype=torch.bfloat16, comm_backend=backend)
        ws.destroy()
    elif what == "fusion":
        return fusion(*args)
    elif what == "direct":
        from flashinfer.comm.trtllm_ar import (trtllm_create_ipc_workspace_for_all_reduce_fusion,
                                               trtllm_destroy_ipc_workspace_for_all_reduce_fusion)
        handles, _ = trtllm_create_ipc_workspace_for_all_reduce_fusion(
            dist.get_rank(), dist.get_world_size(), TOKENS, HIDDEN)
        trtllm_destroy_ipc_workspace_for_all_reduce_fusion(handles)
    elif what == "symm":
        return symm()
    return "ok"


def symm() -> str:
    from flashinfer.comm.mnnvl import (SymmDeviceMemory, TorchDistBackend,
                                       create_tensor_from_cuda_memory)
    rank, n = dist.get_rank(), dist.get_world_size()
    dev = torch.cuda.current_device()
    mem = SymmDeviceMemory(1 << 21, n, rank, dev, TorchDistBackend(), enable_multicast=False)

    def at(r: int) -> torch.Tensor:
        return create_tensor_from_cuda_memory(mem.get_unicast_ptr(r), (256,), torch.int32, dev)

    at(rank).fill_(rank + 1)
    dist.barrier()
    seen = [int(at(r)[255]) for r in range(n)]
    dist.barrier()
    return f"{mem._exchanger.handle_type.name} {seen}"


def main() -> None:
    what, args = sys.argv[1], sys.argv[2:]
    rank = int(os.environ.get("RANK", 0))
    if what in ("workspace", "fusion", "direct", "symm"):
        dist.init_process_group(backend="nccl")
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    try:
        outcome = step(what, args)
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
