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
  three) and a fourth forced two-shot (`use_oneshot=False`, the kernel mnnvl takes past
  its one-shot threshold), then kARResidualRMSNorm one-shot and two-shot, each checked
  here against a torch reference of every rank's input; the outcome names the backend the workspace got and the first
  mismatch, then destroy; with `skipN`, rank N creates the workspace but never calls
  allreduce_fusion;
- `direct`: `trtllm_create_ipc_workspace_for_all_reduce_fusion` as older callers use it;
- `moe [plant] [direct]`: the trtllm workspace and `allreduce_fusion` with the two MoE
  patterns (expert reduction, MoE finalize), or with `direct` the two ops by name over the
  direct workspace, each checked against an exact reference;
- `vllm_ar [plant|graph]`: FlashInfer's vLLM custom all-reduce (`flashinfer.comm.vllm_ar`)
  over legacy-IPC buffers, each dtype checked against the reference; with `graph` also two
  all-reduces captured in a CUDA graph, their buffers registered, the graph replayed;
- `mnnvl_memory [plant]`: FlashInfer's MnnvlMemory mapped at every rank, every segment read;
- `large`: backend="auto" with a payload past the MNNVL one-shot threshold, one kAllReduce;
- `pcie`: FlashInfer's PCIe IPC topology probe, then its PcieIpcAllReduceWorkspace;
- `direct-fusion`: that workspace, then `trtllm_allreduce_fusion` by keyword (0.4.1's and
  0.7.2.post1's signatures agree on these), the rounds of `fusion` with a two-shot one;
  `direct-fusion plant` plants a wrong value in rank 0's first result before its check;
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
    return (residual_norm_mismatch(f"{backend}: kARResidualRMSNorm", total, residual, gamma,
                                   res_out, norm_out) or f"ok {backend}")


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

        def run(x, pattern, use_oneshot, **outs):
            if pattern == P.kAllReduce:
                return comm.allreduce_fusion(input=x, workspace=ws, pattern=pattern,
                                             output=outs["allreduce_out"], use_oneshot=use_oneshot)
            comm.allreduce_fusion(input=x, workspace=ws, pattern=pattern, rms_eps=1e-6,
                                  use_oneshot=use_oneshot, **outs)
        return check_rounds(run, got, twoshot=True)
    finally:
        ws.destroy()


def direct_fusion(plant: str = "") -> str:
    """The workspace as older callers build it (`trtllm_create_ipc_workspace_for_all_reduce_
    fusion`, 0.4.1's only way) and `trtllm_allreduce_fusion` called by keyword as both 0.4.1
    and 0.7.2.post1 accept it."""
    from flashinfer.comm import AllReduceFusionPattern as P
    from flashinfer.comm.trtllm_ar import (trtllm_create_ipc_workspace_for_all_reduce_fusion,
                                           trtllm_destroy_ipc_workspace_for_all_reduce_fusion)
    n, me = dist.get_world_size(), dist.get_rank()
    handles, ptrs = trtllm_create_ipc_workspace_for_all_reduce_fusion(me, n, TOKENS, HIDDEN)[:2]

    def run(x, pattern, use_oneshot, **outs):
        args = dict(allreduce_out=None, residual_in=None, residual_out=None, norm_out=None,
                    rms_gamma=None)
        args.update(outs)
        comm.trtllm_allreduce_fusion(
            allreduce_in=x, world_size=n, world_rank=me, token_num=TOKENS, hidden_dim=HIDDEN,
            workspace_ptrs=ptrs, launch_with_pdl=False, trigger_completion_at_end=True,
            fp32_acc=True, pattern_code=pattern, use_oneshot=use_oneshot, quant_out=None,
            scale_out=None, rms_eps=1e-6, scale_factor=None, layout_code=None, **args)
        return args["allreduce_out"]
    try:
        return check_rounds(run, "trtllm", twoshot=True, plant=plant == "plant")
    finally:
        trtllm_destroy_ipc_workspace_for_all_reduce_fusion(handles)


def moe(*opts: str) -> str:
    """The trtllm workspace, then `allreduce_fusion` with the MoE patterns as a serving stack
    calls them: kMoEReductionARResidualRMSNorm (three local experts' outputs, each scaled per
    token, plus the FC2 input) and kMoEFinalizeARResidualRMSNorm (top-2 rows of a permuted
    expert output, one index -1, scaled per expanded row, plus a shared expert). Values
    are small integers and power-of-two scales (exact in bfloat16 in any order), so the
    reference is every rank's exact partial sum; the residual add and the norm as in `fusion`.
    With `plant`, rank 0 adds 1 to one element of its first result before the check; with
    `direct`, the workspace of `trtllm_create_ipc_workspace_for_all_reduce_fusion` and the
    two ops called by name (`trtllm_moe_allreduce_fusion`,
    `trtllm_moe_finalize_allreduce_fusion`), as 0.4.1, which has neither the unified API nor
    its MoE patterns, is called: the later releases' extra arguments passed only where the
    installed signature has them."""
    plant, direct = "plant" in opts, "direct" in opts
    n, me = dist.get_world_size(), dist.get_rank()
    if not direct:
        from flashinfer.comm import AllReduceFusionPattern as P
        from flashinfer.comm.mnnvl import TorchDistBackend
        ws = comm.create_allreduce_fusion_workspace(
            backend="trtllm", world_size=n, rank=me, max_token_num=TOKENS, hidden_dim=HIDDEN,
            dtype=torch.bfloat16, comm_backend=TorchDistBackend())
    else:
        from flashinfer.comm.trtllm_ar import (
            trtllm_create_ipc_workspace_for_all_reduce_fusion as create,
            trtllm_destroy_ipc_workspace_for_all_reduce_fusion as destroy)
        handles, ptrs = create(me, n, TOKENS, HIDDEN)[:2]
    experts, top_k = 3, 2
    halves = torch.tensor([0.5, 1.0, 2.0])
    residual = (rank_input(0, 7) / 4).cuda()
    gamma = torch.linspace(0.5, 1.5, HIDDEN).to(torch.bfloat16).cuda()

    def expert_out(r):
        i = torch.arange(experts * TOKENS * HIDDEN).view(experts, TOKENS, HIDDEN)
        return ((i * (r + 2) + 7 * i.div(HIDDEN, rounding_mode="floor")) % 9 - 4).to(torch.bfloat16)

    def reduction(r):
        e, tok = torch.meshgrid(torch.arange(experts), torch.arange(TOKENS), indexing="ij")
        scale = halves[(e + tok + r) % 3]
        part = (expert_out(r).float() * scale[..., None]).sum(0) + rank_input(r, 9).float()
        return scale, part

    def permuted(r):
        rows = torch.arange((TOKENS * top_k + 2) * HIDDEN).view(-1, HIDDEN)
        data = ((rows * (r + 5)) % 11 - 5).to(torch.bfloat16)
        index = torch.arange(TOKENS * top_k, dtype=torch.int32).flip(0).view(TOKENS, top_k) + 1
        index[2, 1] = -1
        scale = halves[(torch.arange(TOKENS * top_k) + r) % 3].view(TOKENS, top_k)
        part = rank_input(r, 11).float()
        for tok in range(TOKENS):
            for k in range(top_k):
                if index[tok, k] != -1:
                    part[tok] += data[index[tok, k]].float() * scale[tok, k]
        return data, index, scale.to(torch.bfloat16), part

    bad = []

    def check(what, res_out, norm_out, partial):
        if plant and me == 0 and not bad:
            res_out[0, 0] += 1
        total = sum(partial(r)[-1] for r in range(n)).to(torch.bfloat16)
        bad.append(residual_norm_mismatch(what, total, residual, gamma, res_out, norm_out))

    try:
        scale, _ = reduction(me)
        res_out, norm_out = torch.empty_like(residual), torch.empty_like(residual)
        moe_in = dict(moe_reduction_device_num_experts=experts,
                      moe_reduction_scale_input=scale.float().cuda(),
                      moe_reduction_active_experts_token_input=expert_out(me).cuda(),
                      moe_reduction_token_input=rank_input(me, 9).cuda())
        if direct:
            comm.trtllm_moe_allreduce_fusion(
                world_size=n, world_rank=me, token_num=TOKENS, hidden_dim=HIDDEN,
                workspace_ptrs=ptrs, launch_with_pdl=False, residual_in=residual,
                rms_gamma=gamma, rms_eps=1e-6, scale_factor=1.0, layout_code=None,
                moe_allreduce_out=None, residual_out=res_out, norm_out=norm_out,
                quant_out=None, scale_out=None, **moe_in)
        else:
            comm.allreduce_fusion(
                input=rank_input(me, 9).cuda(), workspace=ws,
                pattern=P.kMoEReductionARResidualRMSNorm, residual_in=residual,
                residual_out=res_out, norm_out=norm_out, rms_gamma=gamma, rms_eps=1e-6,
                **moe_in)
        check("kMoEReductionARResidualRMSNorm", res_out, norm_out, reduction)
        data, index, scale, _ = permuted(me)
        res_out, norm_out = torch.empty_like(residual), torch.empty_like(residual)
        finalize_in = dict(residual_in=residual, residual_out=res_out, norm_out=norm_out,
                           expanded_idx_to_permuted_idx=index.cuda(),
                           expert_scale_factor=scale.cuda(),
                           shared_expert_output=rank_input(me, 11).cuda())
        if direct:
            import inspect
            later = inspect.signature(comm.trtllm_moe_finalize_allreduce_fusion).parameters
            extra = {k: None for k in ("quant_out", "scale_out", "routed_scaling_factor")
                     if k in later}
            comm.trtllm_moe_finalize_allreduce_fusion(
                allreduce_in=data.cuda(), norm_weight=gamma, workspace_ptrs=ptrs,
                launch_with_pdl=False, world_rank=me, world_size=n, eps=1e-6, **extra,
                **finalize_in)
        else:
            comm.allreduce_fusion(
                input=data.cuda(), workspace=ws, pattern=P.kMoEFinalizeARResidualRMSNorm,
                rms_gamma=gamma, rms_eps=1e-6, **finalize_in)
        check("kMoEFinalizeARResidualRMSNorm", res_out, norm_out, permuted)
        return next((b for b in bad if b), "ok trtllm moe")
    finally:
        if direct:
            destroy(handles)
        else:
            ws.destroy()


def vllm_ar(plant: str = "") -> str:
    """FlashInfer's vLLM custom all-reduce as its own test drives it: signal and data buffers
    from `create_shared_buffer` (legacy CUDA IPC), `vllm_init_custom_ar` over the signal
    buffers (full NVLink), the data buffers registered, then `vllm_all_reduce` of each dtype
    through the registered buffer, checked against the sum of every rank's input; with
    `plant`, rank 0 adds 1 to one element of its first result before the check."""
    rank, n = dist.get_rank(), dist.get_world_size()
    group, max_size = dist.group.WORLD, 1 << 16
    meta = comm.create_shared_buffer(comm.vllm_meta_size() + max_size, group=group)
    bufs = comm.create_shared_buffer(max_size, group=group)
    rank_data = torch.empty(1 << 16, dtype=torch.uint8, device="cuda")
    fa = comm.vllm_init_custom_ar(meta, rank_data, rank, True)
    bad = []
    try:
        comm.vllm_register_buffer(fa, bufs)
        for dtype in (torch.float32, torch.float16, torch.bfloat16):
            inp = rank_input(rank, 3).to(dtype).view(-1).cuda()
            out = torch.empty_like(inp)
            comm.vllm_all_reduce(fa, inp, out, bufs[rank], max_size, 8)
            if plant == "plant" and rank == 0 and not bad:
                out[0] += 1
            want = sum(rank_input(r, 3).to(dtype).view(-1).float() for r in range(n))
            if not torch.equal(out.cpu(), want.to(dtype)):
                bad.append(f"vllm_all_reduce {dtype} differs from the reference")
        if plant == "graph":
            bad += vllm_ar_graph(fa, rank, n)
        return bad[0] if bad else "ok vllm_ar"
    finally:
        dist.barrier()
        comm.vllm_dispose(fa)
        comm.free_shared_buffer(bufs, group)
        comm.free_shared_buffer(meta, group)


def pcie() -> str:
    """FlashInfer's PCIe IPC all-reduce as a serving stack builds it: its topology probe
    (`resolve_pcie_ipc_profile`: NVML common ancestors between the group's GPUs, by the UUIDs
    torch reports), then `PcieIpcAllReduceWorkspace` over the default group. The outcome is
    the profile the probe decided, its reason, and the workspace's outcome."""
    from flashinfer.comm.pcie_ipc_ar import PcieIpcAllReduceWorkspace
    from flashinfer.comm.pcie_ipc_topology import resolve_pcie_ipc_profile
    decision = resolve_pcie_ipc_profile(dist.group.WORLD)
    try:
        ws = PcieIpcAllReduceWorkspace(dist.group.WORLD, max_numel=TOKENS * HIDDEN)
        ws.destroy()
        made = "workspace ok"
    except Exception as e:                   # reported, judged by the test
        made = f"{type(e).__name__}: {e}"
    return f"{decision.profile} ({decision.reason}) | {made}"


def mnnvl_memory(plant: str = "") -> str:
    """FlashInfer's MnnvlMemory as TensorRT-LLM-style callers use it: initialize, the comm
    from an MnnvlConfig over TorchDistBackend, one allocation mapped at every rank's stride
    (FABRIC handles where NVML reports the fabric, else POSIX fds); each rank writes rank + 1
    into its own segment and reads every segment, each segment a tensor from FlashInfer's
    `create_tensor_from_cuda_memory` at `ptr + rank * rank_stride` (as_torch_strided_tensor
    spans the unmapped gaps between segments, which commsim's from_dlpack refuses). With
    `plant`, rank 0 reports its own segment one higher (the check must then fail)."""
    from flashinfer.comm.mapping import Mapping
    from flashinfer.comm.mnnvl import (MnnvlConfig, MnnvlMemory, TorchDistBackend,
                                       create_tensor_from_cuda_memory)
    n, me = dist.get_world_size(), dist.get_rank()
    mapping = Mapping(world_size=n, rank=me, gpus_per_node=torch.cuda.device_count(),
                      tp_size=n)
    MnnvlMemory.initialize()
    MnnvlMemory.set_comm_from_config(mapping, MnnvlConfig(comm_backend=TorchDistBackend()))
    mem = MnnvlMemory(mapping, 1 << 16)
    handle = "FABRIC" if MnnvlMemory._fabric_supported else "POSIX_FILE_DESCRIPTOR"
    dev = torch.cuda.current_device()
    segments = [create_tensor_from_cuda_memory(mem.ptr + r * mem.rank_stride, (256,),
                                               torch.int32, dev) for r in range(n)]
    segments[me].fill_(me + 1)
    dist.barrier()
    seen = [int(segments[r][-1]) + (plant == "plant" and me == 0 and r == 0) for r in range(n)]
    dist.barrier()
    del segments, mem
    want = list(range(1, n + 1))
    return f"{handle} ok" if seen == want else f"{handle} read {seen}, not {want}"


def large() -> str:
    """backend="auto" with a payload past MNNVL_ONE_SHOT_THRESHOLD (2304 tokens x 256 x 2
    ranks x 2 bytes = 2.25 MiB > 1 MiB, for two ranks): FlashInfer's own strategy choice,
    then one kAllReduce through `allreduce_fusion`, checked against the reference."""
    from flashinfer.comm import AllReduceFusionPattern as P
    from flashinfer.comm.mnnvl import TorchDistBackend
    from flashinfer.comm.trtllm_mnnvl_ar import MNNVLAllreduceFusionStrategy
    n, me, tokens = dist.get_world_size(), dist.get_rank(), 2304

    def rank_rows(r):
        i = torch.arange(tokens * HIDDEN, dtype=torch.float32).view(tokens, HIDDEN)
        return ((i * (r + 3)) % 13 - 6).to(torch.bfloat16)

    ws = comm.create_allreduce_fusion_workspace(
        backend="auto", world_size=n, rank=me, max_token_num=tokens, hidden_dim=HIDDEN,
        dtype=torch.bfloat16, comm_backend=TorchDistBackend())
    try:
        strategy = MNNVLAllreduceFusionStrategy.select_strategy(n, tokens, HIDDEN,
                                                                torch.bfloat16)
        x = rank_rows(me).cuda()
        out = comm.allreduce_fusion(input=x, workspace=ws, pattern=P.kAllReduce,
                                    output=torch.empty_like(x))
        want = sum(rank_rows(r).float() for r in range(n)).to(torch.bfloat16)
        same = "ok" if torch.equal(out.cpu(), want) else "differs from the reference"
        return f"{ws.backend} {strategy.name} {same}"
    finally:
        ws.destroy()


def vllm_ar_graph(fa, rank: int, n: int) -> list[str]:
    """FlashInfer's own graph test: two all-reduces captured in a CUDA graph on unregistered
    inputs, their IPC handles and offsets all-gathered and registered, new inputs copied in,
    the graph replayed; each output checked against the reference."""
    inps = [(rank_input(rank, k).view(-1) + 0).cuda() for k in (4, 5)]
    outs = [torch.empty_like(x) for x in inps]
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g, stream=torch.cuda.Stream()):
        for x, y in zip(inps, outs):
            comm.vllm_all_reduce(fa, x, y, 0, 0, 8)
    handles, offsets = comm.vllm_get_graph_buffer_ipc_meta(fa)
    all_handles, all_offsets = [None] * n, [None] * n
    dist.all_gather_object(all_handles, handles)
    dist.all_gather_object(all_offsets, offsets)
    comm.vllm_register_graph_buffers(fa, all_handles, all_offsets)
    for x, k in zip(inps, (6, 7)):
        x.copy_(rank_input(rank, k).view(-1).cuda())
    g.replay()
    torch.cuda.synchronize()
    bad = []
    for y, k in zip(outs, (6, 7)):
        want = sum(rank_input(r, k).view(-1).float() for r in range(n)).to(y.dtype)
        if not torch.equal(y.cpu(), want):
            bad.append(f"vllm_all_reduce replayed from a graph differs from the reference")
    return bad


def check_rounds(run, got: str, twoshot: bool, plant: bool = False) -> str:
    """Three rounds of kAllReduce (the Lamport buffers rotate through all three; with
    `twoshot` a fourth on the two-shot kernel) and one kARResidualRMSNorm (with `twoshot`
    one more, two-shot) through
    `run(x, pattern, use_oneshot, **outputs)`, each checked against a torch reference of
    every rank's input: "ok <got>" or the first mismatch (every round runs either way, so the
    peers are not left waiting). With `plant`, rank 0 adds 1 to one
    element of its round-0 result before the check (the check must then fail)."""
    from flashinfer.comm import AllReduceFusionPattern as P
    ws_size, me = dist.get_world_size(), dist.get_rank()
    bad = []
    for rnd in range(4 if twoshot else 3):
        x = rank_input(me, rnd).cuda()
        out = run(x, P.kAllReduce, False if rnd == 3 else None,
                  allreduce_out=torch.empty_like(x))
        if plant and rnd == 0 and me == 0:
            out[0, 0] += 1
        want = sum(rank_input(r, rnd).float() for r in range(ws_size)).to(torch.bfloat16)
        if not torch.equal(out.cpu(), want):
            bad.append(f"{got}: kAllReduce round {rnd} differs from the reference")
    x = rank_input(me, 5).cuda()
    residual = (rank_input(0, 7) / 4).cuda()
    gamma = torch.linspace(0.5, 1.5, HIDDEN).to(torch.bfloat16).cuda()
    total = sum(rank_input(r, 5).float() for r in range(ws_size)).to(torch.bfloat16)
    for use_oneshot in (None, False) if twoshot else (None,):
        res_out, norm_out = torch.empty_like(x), torch.empty_like(x)
        run(x, P.kARResidualRMSNorm, use_oneshot, residual_in=residual, residual_out=res_out,
            norm_out=norm_out, rms_gamma=gamma)
        shot = " two-shot" if use_oneshot is False else ""
        bad.append(residual_norm_mismatch(f"{got}: kARResidualRMSNorm{shot}", total, residual,
                                          gamma, res_out, norm_out))
    return next((b for b in bad if b), f"ok {got}")


def residual_norm_mismatch(what, total, residual, gamma, res_out, norm_out) -> str:
    """"" when residual_out is exactly the all-reduced `total` plus `residual` (one bfloat16
    rounding) and norm_out its RMSNorm with `gamma` (within 1e-2), else what differs."""
    want_res = (total.float() + residual.cpu().float()).to(torch.bfloat16)
    v = want_res.float()
    want_norm = (v * torch.rsqrt((v * v).mean(-1, keepdim=True) + 1e-6)
                 * gamma.cpu().float()).to(torch.bfloat16)
    if not torch.equal(res_out.cpu(), want_res):
        return f"{what} residual_out differs from the reference"
    if not torch.allclose(norm_out.cpu().float(), want_norm.float(), rtol=1e-2, atol=1e-2):
        return f"{what} norm_out differs from the reference"
    return ""


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
    elif what == "vllm_ar":
        return vllm_ar(*args)
    elif what == "mnnvl_memory":
        return mnnvl_memory(*args)
    elif what == "large":
        return large()
    elif what == "pcie":
        return pcie()
    elif what == "moe":
        return moe(*args)
    elif what == "direct-fusion":
        return direct_fusion(*args)
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
    if what in ("workspace", "fusion", "large", "moe", "vllm_ar", "pcie", "mnnvl_memory",
                "direct", "direct-fusion", "symm"):
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
