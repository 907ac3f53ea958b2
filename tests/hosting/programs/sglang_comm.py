"""SGLang's own communication set-up, unmodified (needs the installed sglang and
flashinfer-python), one step named by argv[1]:
- `fusion BACKEND`: SGLang's `FlashInferWorkspaceManager` (sglang/srt/layers/
  flashinfer_comm_fusion.py) initialised as its `ensure_workspace_initialized` does it
  (`group` and `cpu_group` a gloo group, `device_group` the NCCL world, dtype bfloat16),
  then, when SGLang kept the workspace, `allreduce_fusion` called with the arguments its
  `flashinfer_allreduce_residual_rmsnorm` passes (kARResidualRMSNorm, launch_with_pdl,
  fp32_acc on trtllm), checked against a torch reference of every rank's input; then the
  manager's `cleanup()`. The outcome names the backend, or SGLang's own verdict
  (`_flashinfer_allreduce_unavailable`) when it declined the workspace;
- `custom`: SGLang's world group (`parallel_state.init_distributed_environment`), then its
  `CustomAllreduce(group=cpu_group, device=device)` (sglang/srt/distributed/
  device_communicators/custom_all_reduce.py); the outcome names what
  `custom_all_reduce_ops` failed to import when its kernels (sgl_kernel) are missing, else
  their `meta_size` and whether the communicator is enabled, or where its set-up stopped;
  enabled, its `custom_all_reduce` (eager, as SGLang's tensor-parallel all-reduce calls it)
  of every rank's input, checked exactly against their sum.
One RESULT line per rank.
"""

import json
import os
import sys

import torch
import torch.distributed as dist

# The FlashInfer program beside this one: its inputs and its reference of the fused op.
from flashinfer_comm import HIDDEN, TOKENS, rank_input, residual_rmsnorm_outcome

def fusion(backend: str, cpu_group, device_group) -> str:
    from sglang.srt.layers import flashinfer_comm_fusion as f
    world, me = dist.get_world_size(), dist.get_rank()
    mgr = f.FlashInferWorkspaceManager()
    mgr.initialize(world_size=world, rank=me, max_token_num=TOKENS, hidden_dim=HIDDEN,
                   backend=backend, group=cpu_group, dtype=torch.bfloat16,
                   device_group=device_group, cpu_group=cpu_group)
    if not mgr.initialized:
        return f"declined (unavailable={f._flashinfer_allreduce_unavailable})"
    try:
        comm = f._flashinfer_comm
        x = rank_input(me, 5).cuda()
        residual = (rank_input(0, 7) / 4).cuda()
        gamma = torch.linspace(0.5, 1.5, HIDDEN).to(torch.bfloat16).cuda()
        res_out, norm_out = torch.empty_like(residual), torch.empty_like(x)
        kwargs = dict(input=x, workspace=mgr.workspace,
                      pattern=comm.AllReduceFusionPattern.kARResidualRMSNorm,
                      launch_with_pdl=True, residual_out=res_out, norm_out=norm_out,
                      residual_in=residual, rms_gamma=gamma, rms_eps=1e-6, use_oneshot=None)
        if mgr.backend == "trtllm":
            kwargs["fp32_acc"] = True
        if f._flashinfer_allreduce_supports_trigger_completion:
            kwargs["trigger_completion_at_end"] = False
        comm.allreduce_fusion(**kwargs)
        return residual_rmsnorm_outcome(mgr.backend, world, residual, gamma, res_out, norm_out)
    finally:
        mgr.cleanup()


def custom(cpu_group, device: torch.device) -> str:
    from sglang.srt.distributed import parallel_state
    from sglang.srt.distributed.device_communicators import custom_all_reduce_ops as ops
    from sglang.srt.distributed.device_communicators.custom_all_reduce import CustomAllreduce
    # SGLang's world group (its P2P check caches through it), over the initialised WORLD.
    parallel_state.init_distributed_environment(
        world_size=dist.get_world_size(), rank=dist.get_rank(),
        local_rank=int(os.environ["LOCAL_RANK"]), backend="nccl")
    if not ops.IS_CUSTOM_AR_AVAILABLE:
        try:
            import sgl_kernel.allreduce  # noqa: F401  (what custom_all_reduce_ops imports)
            why = "sgl_kernel.allreduce imports"
        except ImportError as e:
            why = f"{type(e).__name__}: {e}"
        return f"no kernels ({why})"
    head = f"kernels (meta_size {ops.meta_size()}); "
    try:
        ca = CustomAllreduce(group=cpu_group, device=device)
    except Exception as e:                  # where the communicator's set-up stops
        return head + f"{type(e).__name__}: {e}"
    if ca.disabled:
        return head + "disabled"
    try:
        # What SGLang's tensor-parallel all-reduce calls eagerly (no graph capture): the
        # communicator's out-of-place all-reduce through its own IPC buffer.
        world = dist.get_world_size()
        x = rank_input(dist.get_rank(), 3).cuda()
        out = ca.custom_all_reduce(x)
        if out is None:
            return head + "enabled, declined the input"
        want = sum(rank_input(r, 3).float() for r in range(world))
        exact = torch.equal(out.cpu().float(), want)
        return head + ("enabled, all-reduce exact" if exact else "enabled, all-reduce WRONG")
    finally:
        ca.close()


def main() -> None:
    dist.init_process_group("nccl")
    rank = dist.get_rank()
    local_rank = int(os.environ["LOCAL_RANK"]) % max(torch.cuda.device_count(), 1)
    device = torch.device(f"cuda:{local_rank}")
    torch.cuda.set_device(device)
    cpu_group = dist.new_group(list(range(dist.get_world_size())), backend="gloo")
    what = sys.argv[1]
    try:
        if what == "fusion":
            outcome = fusion(sys.argv[2], cpu_group, dist.group.WORLD)
        else:
            outcome = custom(cpu_group, device)
    except Exception as e:                  # the outcome names it; the run goes on to report
        outcome = f"{type(e).__name__}: {e}"
    print("RESULT " + json.dumps({"rank": rank, "outcome": outcome}), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
