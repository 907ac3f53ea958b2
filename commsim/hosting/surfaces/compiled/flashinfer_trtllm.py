"""Served ops of FlashInfer's `trtllm_comm` JIT module: reference kernels over the simulated
driver, with the exported functions' signatures.

Source followed (flashinfer-ai/flashinfer at fb28d7242b3506a2348265962041acc1fb56cca4,
whose files below are byte-identical to those flashinfer-python 0.7.2.post1 ships under
flashinfer/data/): csrc/trtllm_allreduce.cu (`trtllm_lamport_initialize`,
`trtllm_lamport_initialize_all`), csrc/trtllm_allreduce_fusion.cu
(`trtllm_allreduce_fusion`), include/flashinfer/comm/trtllm_allreduce.cuh
(`lamportInitialize`, `lamportInitializeAll`). The fusion kernels follow
include/flashinfer/comm/trtllm_allreduce_fusion.cuh as shipped in the 0.7.2.post1 wheel
(`LamportComm`, `SyncComm`, `Barrier`, `FusedOp`,
`allreduce_fusion_kernel_oneshot_lamport`, `allreduce_fusion_kernel_twoshot_sync`).

Workspace (`trtllm_create_ipc_workspace_for_all_reduce_fusion`): 3 * N peer pointers (comm
buffers, barrier flags, Lamport buffers) then one pointer to five int32 control words
[block counter, sync flag, Lamport flag, Lamport comm size, Lamport clear size]. A reference
kernel runs as one thread block: its flags and counters end where a whole grid leaves them.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from commsim.hosting.surfaces.compiled import kernel_args as ka
from commsim.kernels.context import KernelContext

__all__ = ["trtllm_lamport_initialize", "trtllm_lamport_initialize_all",
           "trtllm_allreduce_fusion", "trtllm_allreduce_fusion_v041", "lamport_exchange"]

_DISPATCH = "DISPATCH_FLOATING_TYPES_FOR_ALLREDUCE"
_BARRIER_FLAGS = 256                      # details::kBarrierFlagCount
# AllReduceFusionPattern values the reference computes -> (allreduce_out, residual + norm);
# the quantising patterns (2-5, 8-11) are not simulated and say so.
_PATTERNS = {0: (True, False), 1: (False, True)}


def _fill_neg_zero(ctx: KernelContext, ptr: int, count: int, esz: int) -> None:
    ka.raw(ctx.array(ptr, np.uint8, count * esz), esz)[:] = ka.NEG_ZERO[esz]


def trtllm_lamport_initialize(buffer_ptr: int, size: int, dtype: Any) -> None:
    """`size` elements of `dtype` at `buffer_ptr` set to negative zero (lamportInitialize;
    size 0 launches nothing). Unsupported dtype: "Unsupported DType for custom op dispatch."
    (DISPATCH_ALLREDUCE_DTYPE)."""
    _, esz = ka.element(dtype, "custom op dispatch")
    if size > 0:
        ka.launch(_fill_neg_zero, int(buffer_ptr), int(size), esz)


def trtllm_lamport_initialize_all(buffer_0_ptr: int, buffer_1_ptr: int, buffer_2_ptr: int,
                                  size: int, dtype: Any) -> None:
    """lamportInitializeAll: each of the three buffers gets lamportInitialize with
    `size / sizeof(T)` elements (the kernel source divides the element count it is given by
    the element size once more; kept as written), then a device synchronisation."""
    _, esz = ka.element(dtype, "custom op dispatch")
    for ptr in (buffer_0_ptr, buffer_1_ptr, buffer_2_ptr):
        if size // esz > 0:
            ka.launch(_fill_neg_zero, int(ptr), int(size) // esz, esz)


def trtllm_allreduce_fusion(allreduce_in: Any, world_size: int, world_rank: int, token_num: int,
                            hidden_size: int, workspace_ptrs: Any, launch_with_pdl: bool,
                            use_oneshot: bool, trigger_completion_at_end: bool, fp32_acc: bool,
                            pattern_code: int, allreduce_out: Any, residual_in: Any,
                            residual_out: Any, norm_out: Any, quant_out: Any, scale_out: Any,
                            rms_gamma: Any, rms_eps: Any, scale_factor: Any, layout_code: Any,
                            block_quant_group_size: Any, weight_bias: Any = None) -> None:
    """The all-reduce of `allreduce_in` over the workspace's ranks, then the pattern's fused
    epilogue (kAllReduce: allreduce_out = sum; kARResidualRMSNorm: residual_out = sum +
    residual_in, norm_out = RMSNorm(residual_out) with rms_gamma). One-shot: the Lamport
    protocol (push to every peer's Lamport buffer, clear the previous round's buffer, spin
    until no slot holds negative zero); two-shot: the comm buffers and the flag barrier
    (reduce-scatter by token ranges, all-gather of the sums)."""
    name, esz = ka.element(allreduce_in.dtype, _DISPATCH)
    pattern = int(pattern_code)
    if pattern not in _PATTERNS:
        raise NotImplementedError(
            f"commsim hosting: trtllm_allreduce_fusion pattern {pattern} is not simulated "
            f"(served: {', '.join(str(p) for p in sorted(_PATTERNS))})")
    n, hidden = int(world_size), int(hidden_size)
    size = int(token_num) * hidden
    if size % hidden:
        raise RuntimeError("params.size % params.hidden_dim != 0")
    if hidden % (16 // esz):
        raise RuntimeError("params.hidden_dim % VEC_SIZE != 0")
    has_out, fused = _PATTERNS[pattern]
    out = dict(
        allreduce_out=ka.address(allreduce_out) if has_out and allreduce_out is not None else 0,
        residual_in=ka.address(residual_in) if fused else 0,
        residual_out=ka.address(residual_out) if fused else 0,
        norm_out=ka.address(norm_out) if fused else 0,
        rms_gamma=ka.address(rms_gamma) if fused else 0,
        eps=float(rms_eps or 0.0), weight_bias=float(weight_bias or 0.0))
    kernel = _oneshot if use_oneshot else _twoshot
    ka.launch(kernel, ka.address(allreduce_in), ka.address(workspace_ptrs), n, int(world_rank),
              size, hidden, name, esz, bool(fp32_acc), out)


def trtllm_allreduce_fusion_v041(allreduce_in: Any, world_size: int, world_rank: int,
                                 token_num: int, hidden_size: int, workspace_ptrs: Any,
                                 launch_with_pdl: bool, use_oneshot: bool,
                                 trigger_completion_at_end: bool, fp32_acc: bool,
                                 pattern_code: int, allreduce_out: Any, residual_in: Any,
                                 residual_out: Any, norm_out: Any, quant_out: Any, scale_out: Any,
                                 rms_gamma: Any, rms_eps: Any, scale_factor: Any,
                                 layout_code: Any) -> None:
    """flashinfer-python 0.4.1's export (csrc/trtllm_allreduce_fusion.cu at v0.4.1,
    a88349f9f43df74d31d1d52ad5aa20c28824a790): 21 arguments, no `block_quant_group_size` and
    no `weight_bias`. Its workspace layout (`SyncComm`, `LamportComm`), `Barrier`, the one- and
    two-shot kernels and the pattern values 0 and 1 are those of the 0.7.2.post1 source above;
    its `FusedOp::rms_norm` multiplies by gamma alone, which is the later kernel with
    weight_bias 0. So the same reference runs, with the two later arguments absent."""
    trtllm_allreduce_fusion(allreduce_in, world_size, world_rank, token_num, hidden_size,
                            workspace_ptrs, launch_with_pdl, use_oneshot,
                            trigger_completion_at_end, fp32_acc, pattern_code, allreduce_out,
                            residual_in, residual_out, norm_out, quant_out, scale_out, rms_gamma,
                            rms_eps, scale_factor, layout_code, None, None)


def _epilogue(ctx: KernelContext, total: torch.Tensor, lo: int, hidden: int, name: str,
              esz: int, o: dict) -> None:
    """FusedOp::operator() over elements [lo, lo + total.numel()) (whole tokens)."""
    if o["allreduce_out"]:
        ka.store(ctx, o["allreduce_out"] + lo * esz, total)
    if o["residual_out"]:
        val = ka.add_in(total, ctx.load(o["residual_in"] + lo * esz, np.uint8,
                                        total.numel() * esz), name)
        ka.store(ctx, o["residual_out"] + lo * esz, val)
        norm = ka.rms_norm(val, ctx.load(o["rms_gamma"], np.uint8, hidden * esz), name, hidden,
                           o["eps"], o["weight_bias"])
        ka.store(ctx, o["norm_out"] + lo * esz, norm)


def lamport_exchange(ctx: KernelContext, ws: int, n: int, me: int, val: np.ndarray, esz: int,
                     what: str, read_peers: bool = False) -> list[np.ndarray]:
    """LamportComm over the fusion workspace, as every one-shot kernel of trtllm_comm uses it:
    `val` (raw elements, negative zeros made +0 as remove_neg_zero does) pushed to slot `me`
    of every rank's current Lamport buffer, this rank's buffer of two rounds ago cleared
    (its clear size, the last round's), a spin until no element of any rank's slot is
    negative zero, then LamportComm::update. The slots are read in this rank's buffer, or
    with `read_peers` slot r in rank r's own buffer (the MoE finalize kernel's loads).
    Returns every rank's slot (raw bytes, rank order)."""
    w = ka.pointers(ctx, ws, 3 * n + 1)
    ctrl = ctx.array(w[3 * n], np.int32, 5)
    flag, comm_size, clear_size = int(ctrl[2]), int(ctrl[3]), int(ctrl[4])
    data = [w[2 * n + r] + (flag % 3) * comm_size for r in range(n)]
    clear = w[2 * n + me] + ((flag + 2) % 3) * comm_size
    size = val.size
    val = val.copy()
    val[val == ka.NEG_ZERO[esz]] = 0                           # remove_neg_zero
    for r in range(n):                                         # push to every rank's slot
        ka.raw(ctx.array(data[r] + me * size * esz, np.uint8, size * esz), esz)[:] = val
    if clear_size > 0:                                         # the previous round's buffer
        ka.raw(ctx.array(clear, np.uint8, clear_size * esz), esz)[:] = ka.NEG_ZERO[esz]
    slots = [ka.raw(ctx.array(data[r if read_peers else me] + r * size * esz, np.uint8,
                              size * esz), esz) for r in range(n)]
    for r, slot in enumerate(slots):
        ka.wait_for(lambda s=slot: not (s == ka.NEG_ZERO[esz]).any(),
                    f"{what} one-shot: Lamport slot of rank {r} (buffer {flag % 3})")
    got = [s.copy().view(np.uint8) for s in slots]
    ctrl[2], ctrl[4], ctrl[0] = (flag + 1) % 3, size * n, 0    # LamportComm::update
    return got


def _oneshot(ctx: KernelContext, inp: int, ws: int, n: int, me: int, size: int, hidden: int,
             name: str, esz: int, fp32_acc: bool, o: dict) -> None:
    """allreduce_fusion_kernel_oneshot_lamport with LamportComm."""
    val = ka.raw(ctx.load(inp, np.uint8, size * esz), esz)
    slots = lamport_exchange(ctx, ws, n, me, val, esz, "trtllm_allreduce_fusion")
    _epilogue(ctx, ka.sum_ranks(slots, name, fp32_acc), 0, hidden, name, esz, o)


def _barrier(ctx: KernelContext, flags: list[int], n: int, me: int, value: int) -> int:
    """Barrier::sync of one block: the next flag value to this rank's slot at every peer
    (the slots of the blocks not launched first), then spin until every peer's slot in
    this rank's flags has left the previous value."""
    nxt = 0 if value == 2 else value + 1
    prev = value
    for r in range(n):
        f = ctx.array(flags[r], np.int32, _BARRIER_FLAGS * n)
        f[me + n:_BARRIER_FLAGS * n:n] = nxt
        f[me] = nxt
    mine = ctx.array(flags[me], np.int32, n)
    for j in range(n):
        ka.wait_for(lambda j=j: int(mine[j]) != prev,
                    f"trtllm_allreduce_fusion two-shot: barrier flag of rank {j} (value {nxt})")
    return nxt


def _twoshot(ctx: KernelContext, inp: int, ws: int, n: int, me: int, size: int, hidden: int,
             name: str, esz: int, fp32_acc: bool, o: dict) -> None:
    """allreduce_fusion_kernel_twoshot_sync with SyncComm: tokens split as the launcher
    splits them (the first token_num % N ranks take one more)."""
    w = ka.pointers(ctx, ws, 3 * n + 1)
    ctrl = ctx.array(w[3 * n], np.int32, 5)
    comm, flags = w[:n], w[n:2 * n]
    tokens = size // hidden
    per, extra = divmod(tokens, n)
    begin = [r * per + min(r, extra) for r in range(n)]
    count = [per + (1 if r < extra else 0) for r in range(n)]
    ctx.array(comm[me], np.uint8, size * esz)[:] = ctx.load(inp, np.uint8, size * esz)
    value = _barrier(ctx, flags, n, me, int(ctrl[1]))
    lo, hi = begin[me] * hidden, (begin[me] + count[me]) * hidden
    if hi > lo:
        part = ka.sum_ranks([ctx.load(comm[r] + lo * esz, np.uint8, (hi - lo) * esz)
                             for r in range(n)], name, fp32_acc)
        for r in range(n):
            ka.store(ctx, comm[r] + (size + lo) * esz, part)
    value = _barrier(ctx, flags, n, me, value)
    for r in range(n):
        lo, hi = begin[r] * hidden, (begin[r] + count[r]) * hidden
        if hi > lo:
            total = ka.tensor(ctx.load(comm[me] + (size + lo) * esz, np.uint8, (hi - lo) * esz),
                              name)
            _epilogue(ctx, total, lo, hidden, name, esz, o)
    ctrl[1], ctrl[0] = value, 0                                # SyncComm::update
