"""Served MoE ops of FlashInfer's `trtllm_comm` JIT module: the expert reduction (or the MoE
finalize) fused into the one-shot Lamport all-reduce and its residual RMSNorm, over the
workspace `trtllm_create_ipc_workspace_for_all_reduce_fusion` builds.

Source followed (flashinfer-ai/flashinfer at fb28d7242b3506a2348265962041acc1fb56cca4,
byte-identical to the files flashinfer-python 0.7.2.post1 ships under flashinfer/data/):
csrc/trtllm_moe_allreduce_fusion.cu (the exported `trtllm_moe_allreduce_fusion`,
`trtllm_moe_finalize_allreduce_fusion`: argument reading and checks) and
include/flashinfer/comm/trtllm_moe_allreduce_fusion.cuh (`moereduction_allreduce_fusion_op`,
`moereduce_allreduce_fusion_kernel_oneshot_lamport`, `moefinalize_allreduce_fusion_op`,
`moefinalize_allreduce_fusion_kernel_oneshot_lamport`, `fused_op`, `rms_norm`, `vec_add`).

Arithmetic as the kernels do it, per element in the element type T (fp16/bf16 only): the
expert accumulator is a vector of T, so each `+=` rounds to T; `vec_add` adds in float and
rounds to T; the ranks' values are summed pairwise in rank order, each add rounded (no fp32
accumulation in these kernels). Both launchers always take the one-shot kernel (more than
128 tokens only logs a warning). Template flags come from pointers as the dispatch reads
them: NormOut from `rms_gamma` (so norm_out is always written), ResidualOut from
`residual_out`, AllReduceOut from `moe_allreduce_out`. The FP4 quantised output is not
simulated and says so. The launch configuration's limits (cluster size, block_size <= 1024)
depend on the device's cluster query and are not checked here (UNCONFIRMED which hidden
sizes a real launch refuses).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from commsim.hosting.surfaces.compiled import kernel_args as ka
from commsim.hosting.surfaces.compiled.flashinfer_trtllm import lamport_exchange
from commsim.kernels.context import KernelContext

__all__ = ["trtllm_moe_allreduce_fusion", "trtllm_moe_finalize_allreduce_fusion",
           "trtllm_moe_allreduce_fusion_v041", "trtllm_moe_finalize_allreduce_fusion_v041"]

_DISPATCH = "DISPATCH_FLOATING_TYPES_FOR_ALLREDUCE"
_NRANKS = (2, 4, 8, 16)                  # DISPATCH_MOEREDUCTION / DISPATCH_MOEFINALIZEREDUCTION


def _check(cond: bool, text: str) -> None:
    # FLASHINFER_CHECK / TVM_FFI_ICHECK inside the export: raised to Python as RuntimeError.
    if not cond:
        raise RuntimeError(text)


def _element(dtype: Any) -> tuple[str, int]:
    """The two element types these kernels dispatch on (no float32)."""
    name, esz = ka.element(dtype, _DISPATCH)
    if name == "float32":
        raise NotImplementedError(f"Unsupported dtype in {_DISPATCH}.")
    return name, esz


def _addr(t: Any) -> int:
    return ka.address(t) if t is not None else 0


def _common_checks(n: int, hidden: int, size: int, esz: int, quant_out: Any) -> None:
    _check(size % hidden == 0, "size must be a multiple of hidden_dim")
    _check(n in _NRANKS, "Unsupported n_ranks")
    if quant_out is not None:
        raise NotImplementedError("commsim hosting: the FP4-quantised output (quant_out) of the "
                                  "trtllm MoE all-reduce fusion is not simulated")


def trtllm_moe_allreduce_fusion(world_size: int, world_rank: int, token_num: int,
                                hidden_size: int, workspace_ptrs: Any, launch_with_pdl: bool,
                                residual_in: Any, rms_gamma: Any, rms_eps: float,
                                scale_factor: float, moe_reduction_device_num_experts: int,
                                moe_reduction_scale_input: Any,
                                moe_reduction_active_experts_token_input: Any,
                                moe_reduction_token_input: Any, layout_code: Any,
                                moe_allreduce_out: Any, residual_out: Any, norm_out: Any,
                                quant_out: Any, scale_out: Any, weight_bias: Any = None) -> None:
    """Per token: the sum over this device's active experts of T(expert value * its float32
    scale), plus the token's FC2 input; that one-shot all-reduced over the workspace's ranks;
    then moe_allreduce_out = sum, residual_out = sum + residual_in,
    norm_out = RMSNorm(residual_out) with rms_gamma."""
    name, esz = _element(moe_reduction_active_experts_token_input.dtype)
    n, hidden = int(world_size), int(hidden_size)
    size = int(token_num) * hidden
    _check(hidden * esz % 16 == 0, "hidden_dim * sizeof(T) must be a multiple of kBytesPerAccess")
    _check(moe_allreduce_out is not None or residual_out is not None or norm_out is not None
           or quant_out is not None, "at least one of moe_allreduce_out, residual_out, "
           "norm_out, quant_out must be set")
    _common_checks(n, hidden, size, esz, quant_out)
    o = dict(allreduce_out=_addr(moe_allreduce_out), residual_in=_addr(residual_in),
             residual_out=_addr(residual_out), norm_out=_addr(norm_out),
             rms_gamma=_addr(rms_gamma), eps=float(rms_eps), weight_bias=float(weight_bias or 0.0))
    moe = dict(experts=int(moe_reduction_device_num_experts),
               scale=_addr(moe_reduction_scale_input),
               expert_in=_addr(moe_reduction_active_experts_token_input),
               token_in=_addr(moe_reduction_token_input))
    ka.launch(_moe_reduce, ka.address(workspace_ptrs), n, int(world_rank), size, hidden, name,
              esz, moe, o)


def trtllm_moe_finalize_allreduce_fusion(allreduce_in: Any, residual_in: Any, norm_weight: Any,
                                         expanded_idx_to_permuted_idx: Any, norm_out: Any,
                                         residual_out: Any, quant_out: Any, scale_out: Any,
                                         launch_with_pdl: bool, workspace: Any, world_rank: int,
                                         world_size: int, eps: float, shared_expert_output: Any,
                                         expert_scale_factor: Any, routed_scaling_factor: Any,
                                         weight_bias: Any = None) -> None:
    """Per token: the sum over its top_k expanded rows of allreduce_in (rows named by
    expanded_idx_to_permuted_idx, -1 skipped; each scaled by expert_scale_factor, read as T,
    when given), times routed_scaling_factor when it is not 1, plus shared_expert_output;
    that one-shot all-reduced; then residual_out = sum + residual_in and
    norm_out = RMSNorm(residual_out) with norm_weight."""
    name, esz = _element(residual_in.dtype)
    hidden, top_k = int(residual_in.shape[-1]), int(expanded_idx_to_permuted_idx.shape[-1])
    size, n = int(residual_in.numel()), int(world_size)
    _check(expanded_idx_to_permuted_idx.dtype == torch.int32,
           "expanded_idx_to_permuted_idx must be int32")
    _check(top_k > 0, "allreduce_in, expanded_idx_to_permuted_idx and top_k must be set")
    _check(hidden % (16 // esz) == 0, "hidden_dim must be a multiple of VEC_SIZE")
    _check(residual_out is not None or norm_out is not None or quant_out is not None,
           "at least one of residual_out, norm_out, quant_out must be set")
    _common_checks(n, hidden, size, esz, quant_out)
    o = dict(allreduce_out=0, residual_in=_addr(residual_in), residual_out=_addr(residual_out),
             norm_out=_addr(norm_out), rms_gamma=_addr(norm_weight), eps=float(eps),
             weight_bias=float(weight_bias or 0.0))
    rsf = 1.0 if routed_scaling_factor is None else float(np.float32(routed_scaling_factor))
    moe = dict(allreduce_in=_addr(allreduce_in), top_k=top_k,
               index=_addr(expanded_idx_to_permuted_idx), scale=_addr(expert_scale_factor),
               shared=_addr(shared_expert_output), routed=rsf)
    ka.launch(_moe_finalize, ka.address(workspace), n, int(world_rank), size, hidden, name, esz,
              moe, o)


def trtllm_moe_allreduce_fusion_v041(world_size: int, world_rank: int, token_num: int,
                                     hidden_size: int, workspace_ptrs: Any,
                                     launch_with_pdl: bool, residual_in: Any, rms_gamma: Any,
                                     rms_eps: float, scale_factor: float,
                                     moe_reduction_device_num_experts: int,
                                     moe_reduction_scale_input: Any,
                                     moe_reduction_active_experts_token_input: Any,
                                     moe_reduction_token_input: Any, layout_code: Any,
                                     moe_allreduce_out: Any, residual_out: Any, norm_out: Any,
                                     quant_out: Any, scale_out: Any) -> None:
    """flashinfer-python 0.4.1's export (csrc/trtllm_moe_allreduce_fusion.cu at v0.4.1,
    a88349f9f43df74d31d1d52ad5aa20c28824a790): 20 arguments, no `weight_bias`; its kernel's
    rms_norm multiplies by gamma alone, the later kernel with weight_bias 0."""
    trtllm_moe_allreduce_fusion(world_size, world_rank, token_num, hidden_size, workspace_ptrs,
                                launch_with_pdl, residual_in, rms_gamma, rms_eps, scale_factor,
                                moe_reduction_device_num_experts, moe_reduction_scale_input,
                                moe_reduction_active_experts_token_input,
                                moe_reduction_token_input, layout_code, moe_allreduce_out,
                                residual_out, norm_out, quant_out, scale_out, None)


def trtllm_moe_finalize_allreduce_fusion_v041(allreduce_in: Any, residual_in: Any,
                                              norm_weight: Any,
                                              expanded_idx_to_permuted_idx: Any,
                                              norm_out: Any, residual_out: Any,
                                              launch_with_pdl: bool, workspace: Any,
                                              world_rank: int, world_size: int, eps: float,
                                              shared_expert_output: Any,
                                              expert_scale_factor: Any) -> None:
    """flashinfer-python 0.4.1's export: 13 arguments (no quant_out, scale_out,
    routed_scaling_factor, weight_bias). Its kernel always adds T(data * block_scale) with
    block_scale 1.0 when no expert_scale_factor is given, which rounds as the later
    vec_add does, and has no routed scaling: the later kernel with those arguments absent."""
    trtllm_moe_finalize_allreduce_fusion(allreduce_in, residual_in, norm_weight,
                                         expanded_idx_to_permuted_idx, norm_out, residual_out,
                                         None, None, launch_with_pdl, workspace, world_rank,
                                         world_size, eps, shared_expert_output,
                                         expert_scale_factor, None, None)


def _row(ctx: KernelContext, ptr: int, row: int, hidden: int, name: str, esz: int) -> torch.Tensor:
    return ka.tensor(ctx.load(ptr + row * hidden * esz, np.uint8, hidden * esz), name)


def _moe_reduce(ctx: KernelContext, ws: int, n: int, me: int, size: int, hidden: int, name: str,
                esz: int, moe: dict, o: dict) -> None:
    """moereduce_allreduce_fusion_kernel_oneshot_lamport."""
    tokens, t = size // hidden, ka.dtype(name)
    scales = ctx.load(moe["scale"], np.float32, moe["experts"] * tokens)
    rows = []
    for tok in range(tokens):
        acc = torch.zeros(hidden, dtype=t)
        for e in range(moe["experts"]):
            x = _row(ctx, moe["expert_in"], e * tokens + tok, hidden, name, esz)
            acc = acc + (x.float() * float(scales[e * tokens + tok])).to(t)
        rows.append(acc + _row(ctx, moe["token_in"], tok, hidden, name, esz))
    _reduce_and_fuse(ctx, ws, n, me, torch.cat(rows), hidden, name, esz, o,
                     "trtllm_moe_allreduce_fusion", read_peers=False)


def _moe_finalize(ctx: KernelContext, ws: int, n: int, me: int, size: int, hidden: int,
                  name: str, esz: int, moe: dict, o: dict) -> None:
    """moefinalize_allreduce_fusion_kernel_oneshot_lamport (ScaleType = T)."""
    tokens, top_k, t = size // hidden, moe["top_k"], ka.dtype(name)
    index = ctx.load(moe["index"], np.int32, tokens * top_k)
    scale = (ka.tensor(ctx.load(moe["scale"], np.uint8, tokens * top_k * esz), name)
             if moe["scale"] else None)
    rows = []
    for tok in range(tokens):
        acc = torch.zeros(hidden, dtype=t)
        for k in range(top_k):
            p = int(index[tok * top_k + k])
            if p == -1:
                continue
            x = _row(ctx, moe["allreduce_in"], p, hidden, name, esz)
            if scale is not None:
                acc = acc + (x.float() * float(scale[tok * top_k + k])).to(t)
            else:
                acc = acc + x
        if moe["routed"] != 1.0:
            acc = (acc.float() * moe["routed"]).to(t)
        if moe["shared"]:
            acc = acc + _row(ctx, moe["shared"], tok, hidden, name, esz)
        rows.append(acc)
    _reduce_and_fuse(ctx, ws, n, me, torch.cat(rows), hidden, name, esz, o,
                     "trtllm_moe_finalize_allreduce_fusion", read_peers=True)


def _reduce_and_fuse(ctx: KernelContext, ws: int, n: int, me: int, val: torch.Tensor,
                     hidden: int, name: str, esz: int, o: dict, what: str,
                     read_peers: bool) -> None:
    """The Lamport one-shot exchange, the pairwise sum in T, then fused_op: the all-reduce
    out, residual add (vec_add), residual out, RMSNorm (always: NormOut is rms_gamma's)."""
    raw = ka.raw(val.contiguous().view(torch.uint8).numpy(), esz)
    total = ka.sum_ranks(lamport_exchange(ctx, ws, n, me, raw, esz, what, read_peers), name, False)
    if o["allreduce_out"]:
        ka.store(ctx, o["allreduce_out"], total)
    res = ka.add_in(total, ctx.load(o["residual_in"], np.uint8, total.numel() * esz), name)
    if o["residual_out"]:
        ka.store(ctx, o["residual_out"], res)
    norm = ka.rms_norm(res, ctx.load(o["rms_gamma"], np.uint8, hidden * esz), name, hidden,
                       o["eps"], o["weight_bias"])
    ka.store(ctx, o["norm_out"], norm)
