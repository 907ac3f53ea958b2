"""Served op of FlashInfer's `trtllm_mnnvl_comm` JIT module (the mnnvl backend that
`create_allreduce_fusion_workspace(backend="auto")` picks where multicast is supported).

Source followed (flashinfer-ai/flashinfer at fb28d7242b3506a2348265962041acc1fb56cca4,
byte-identical to the files flashinfer-python 0.7.2.post1 ships under flashinfer/data/):
csrc/trtllm_mnnvl_allreduce.cu (`trtllm_mnnvl_allreduce_fusion`: its argument checks) and
include/flashinfer/comm/trtllm_mnnvl_allreduce.cuh (`LamportFlags`, `LamportBufferLayout`,
`oneshotAllreduceFusionKernel`, `isLamportDirty`, `reduceOneshotDeterministic`,
`twoshotAllreduceKernel`, `reduceLamportRanksChunked`, `rmsNormLamport`).

Flags (`buffer_flags_mnnvl`, uint32): [current index, dirty index, bytes per buffer, dirty
stages, bytes to clear per stage x4, arrival counter]. The one-shot kernel multicast-stores
this rank's tokens into slot `rank` of every member's current Lamport buffer, clears the
dirty buffer of the previous round, spins until no 32-bit word of a peer's slot in its own
buffer is the float negative zero, and sums in float32 in rank order (one rounding).

The two-shot kernel (the path `backend="auto"`/mnnvl takes past MNNVL_ONE_SHOT_THRESHOLD,
1 MiB of tokens * dim * ranks * element size) splits each Lamport buffer into two stages:
token t goes to slot `rank` of row t // N in the SCATTER stage of rank t % N; each rank
reduces the tokens it owns (float32 in rank order, per chunk of 16 ranks) and
multicast-stores them to the BROADCAST stage; every rank then spins on its own BROADCAST
copy of every token. With RMSNorm fusion the second launch (rmsNormLamport) adds the
residual in T (the prenormed output) and normalises: out = T((weight_bias + gamma) * x * r).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from commsim.hosting.surfaces.compiled import kernel_args as ka
from commsim.kernels.context import KernelContext

__all__ = ["trtllm_mnnvl_allreduce_fusion"]

_NEG_ZERO_F32 = np.uint32(0x80000000)     # kNEGZERO_FP32, also the clear value of every T
_TWOSHOT_SIZES = (2, 4, 8, 16, 32, 64)    # twoshotAllreduceFusionDispatch's world sizes
_RANK_CHUNK = 16                          # reduceLamportRanksChunked's kRankChunk (at most)


def _check(cond: bool, text: str) -> None:
    # TVM_FFI_ICHECK: tvm-ffi raises its failure as a RuntimeError with the streamed text.
    if not cond:
        raise RuntimeError(text)


def trtllm_mnnvl_allreduce_fusion(input: Any, multicast_buffer_ptr: int, buffer_ptrs_dev: int,
                                  buffer_ptr_local: int, buffer_flags_mnnvl: Any, nranks: int,
                                  rank: int, rmsnorm_fusion: bool, launch_with_pdl: bool,
                                  use_oneshot: bool, output: Any, residual_out: Any,
                                  residual_in: Any, gamma: Any, epsilon: Any,
                                  weight_bias: Any = None, quant_type: Any = 0,
                                  quant_out: Any = None, sf_out: Any = None,
                                  output_scale: Any = None, layout_code: Any = None) -> None:
    """All-reduce of `input` [tokens, dim] into `output` (and with `rmsnorm_fusion`:
    residual_out = sum + residual_in, output = RMSNorm(residual_out) with gamma)."""
    name, esz = ka.element(input.dtype, "DISPATCH_FLOATING_TYPES_FOR_MNNVL_ALLREDUCE")
    tokens, dim = int(input.shape[0]), int(input.shape[1])
    _check(dim % (16 // esz) == 0, f"token_dim must be divisible by {16 // esz}")
    _check(output is not None or int(quant_type or 0) != 0,
           "output must be provided unless quantization fusion is enabled")
    if output is not None:
        _check(tuple(output.shape[:2]) == (tokens, dim),
               f"output shape mismatch: expected ({tokens}, {dim}) but got "
               f"({output.shape[0]}, {output.shape[1]})")
    _check(2 <= nranks <= 64, f"nranks must be between 2 and 64, got {nranks}")
    _check(0 <= rank < nranks, f"rank must be between 0 and nranks-1, got {rank}")
    _check(not rmsnorm_fusion or None not in (residual_in, residual_out, gamma, epsilon),
           "residual_in, residual_out, gamma, and epsilon must be provided if rmsnorm_fusion "
           "is true")
    if int(quant_type or 0) != 0:
        raise NotImplementedError(f"commsim hosting: trtllm_mnnvl_allreduce_fusion quant_type "
                                  f"{int(quant_type)} is not simulated (served: 0, none)")
    if not use_oneshot:
        # twoshotAllreduceFusionDispatch's launch switch (FLASHINFER_ERROR, then the export's
        # TVM_FFI_ICHECK on the cudaErrorInvalidValue it returns).
        _check(nranks in _TWOSHOT_SIZES, "trtllm_mnnvl_allreduce_fusion failed with error code "
               "invalid argument")
    o = dict(output=ka.address(output) if output is not None else 0,
             residual_in=ka.address(residual_in) if rmsnorm_fusion else 0,
             residual_out=ka.address(residual_out) if rmsnorm_fusion else 0,
             gamma=ka.address(gamma) if rmsnorm_fusion else 0,
             eps=float(epsilon or 0.0), weight_bias=float(weight_bias or 0.0))
    ka.launch(_oneshot if use_oneshot else _twoshot, ka.address(input),
              int(multicast_buffer_ptr), int(buffer_ptrs_dev), ka.address(buffer_flags_mnnvl),
              int(nranks), int(rank), tokens, dim, name, esz, o)


def _oneshot(ctx: KernelContext, inp: int, mc: int, ptrs_dev: int, flags_ptr: int, n: int,
             me: int, tokens: int, dim: int, name: str, esz: int, o: dict) -> None:
    flags = ctx.array(flags_ptr, np.uint32, 9)
    cur, dirty, per_buffer, dirty_stages = (int(x) for x in flags[:4])
    to_clear = [int(x) for x in flags[4:8]]
    local = ka.pointers(ctx, ptrs_dev, n)[me]            # params.inputPtrs[params.rank]
    row = dim * n * esz                                  # one token's slots, every rank
    val = ka.raw(ctx.load(inp, np.uint8, tokens * dim * esz).copy(), esz)
    val[val == ka.NEG_ZERO[esz]] = 0                     # sanitizeLamportPayload
    payload = val.view(np.uint8).reshape(tokens, dim * esz)
    stage_mc = mc + cur * per_buffer
    for t in range(tokens):                              # multimem store to every member
        ctx.multimem_store(stage_mc + t * row + me * dim * esz, payload[t])
    # clearDirtyLamportBuf(inputPtrs[rank], -1): the dirty buffer's stages, float -0.
    stage_bytes = per_buffer // max(dirty_stages, 1)
    for s in range(dirty_stages):
        if to_clear[s]:
            nbytes = -(-to_clear[s] // 16) * 16         # whole float4 stores
            ctx.array(local + (dirty * dirty_stages + s) * stage_bytes, np.uint32,
                      nbytes // 4)[:] = _NEG_ZERO_F32
    stage = ctx.array(local + cur * per_buffer, np.uint8, tokens * row).reshape(tokens, n, dim * esz)
    for r in range(n):
        if r != me:
            words = stage[:, r, :].view(np.uint32)
            ka.wait_for(lambda w=words: not (w == _NEG_ZERO_F32).any(),
                        f"trtllm_mnnvl_allreduce_fusion one-shot: Lamport slot of rank {r} "
                        f"(buffer {cur})")
    slots = [payload if r == me else stage[:, r, :] for r in range(n)]
    total = ka.sum_ranks([np.ascontiguousarray(s).reshape(-1) for s in slots], name, True)
    if o["residual_out"]:
        total = ka.add_in(total, ctx.load(o["residual_in"], np.uint8, total.numel() * esz), name)
        ka.store(ctx, o["residual_out"], total)
        total = ka.rms_norm(total, ctx.load(o["gamma"], np.uint8, dim * esz), name, dim,
                            o["eps"], o["weight_bias"])
    if o["output"]:
        ka.store(ctx, o["output"], total)
    # waitAndUpdate: current becomes dirty, one stage of tokens * dim * N elements to clear.
    flags[:8] = [(cur + 1) % 3, cur, per_buffer, 1, tokens * dim * n * esz, 0, 0, 0]
    flags[8] = 0


def _stage(base: int, index: int, stage: int, stages: int, per_buffer: int) -> int:
    """LamportBufferLayout::getStagePtr."""
    return base + (index * stages + stage) * (per_buffer // stages)


def _twoshot(ctx: KernelContext, inp: int, mc: int, ptrs_dev: int, flags_ptr: int, n: int,
             me: int, tokens: int, dim: int, name: str, esz: int, o: dict) -> None:
    """twoshotAllreduceKernel (then rmsNormLamport with RMSNorm fusion), one rank's grid."""
    flags = ctx.array(flags_ptr, np.uint32, 9)
    cur, dirty, per_buffer, dirty_stages = (int(x) for x in flags[:4])
    to_clear = [int(x) for x in flags[4:8]]
    ptrs = ka.pointers(ctx, ptrs_dev, n)
    local, row = ptrs[me], dim * esz
    val = ka.raw(ctx.load(inp, np.uint8, tokens * row).copy(), esz)
    val[val == ka.NEG_ZERO[esz]] = 0                     # sanitizeLamportPayload
    payload = val.view(np.uint8).reshape(tokens, row)
    for t in range(tokens):                              # scatter to the token's owner
        dest = _stage(ptrs[t % n], cur, 0, 2, per_buffer)
        ctx.array(dest + ((t // n) * n + me) * row, np.uint8, row)[:] = payload[t]
    for s in (0, 1):                                     # clearDirtyLamportBuf(SCATTER / BROADCAST)
        if s < dirty_stages and to_clear[s]:
            nbytes = -(-to_clear[s] // 16) * 16
            ctx.array(_stage(local, dirty, s, dirty_stages, per_buffer), np.uint32,
                      nbytes // 4)[:] = _NEG_ZERO_F32
    scatter = _stage(local, cur, 0, 2, per_buffer)
    for t in range(me, tokens, n):                       # the tokens this rank owns
        slots = ctx.array(scatter + (t // n) * n * row, np.uint8, n * row).reshape(n, row)
        for r in range(n):
            words = slots[r].view(np.uint32)
            ka.wait_for(lambda w=words: not (w == _NEG_ZERO_F32).any(),
                        f"trtllm_mnnvl_allreduce_fusion two-shot: scatter slot of rank {r} "
                        f"(token {t}, buffer {cur})")
        ranks = [ka.tensor(slots[r].copy(), name).float() for r in range(n)]
        acc = torch.zeros(dim)
        for b in range(0, n, _RANK_CHUNK):               # float32, rank order, per chunk
            chunk = torch.zeros(dim)
            for x in ranks[b:b + _RANK_CHUNK]:
                chunk = chunk + x
            acc = acc + chunk
        out = ka.raw(acc.to(ka.dtype(name)).view(torch.uint8).numpy().copy(), esz)
        out[out == ka.NEG_ZERO[esz]] = 0                 # sanitize before the broadcast
        ctx.multimem_store(_stage(mc, cur, 1, 2, per_buffer) + t * row, out.view(np.uint8))
    bcast = ctx.array(_stage(local, cur, 1, 2, per_buffer), np.uint8, tokens * row)
    words = bcast.view(np.uint32)
    ka.wait_for(lambda: not (words == _NEG_ZERO_F32).any(),
                f"trtllm_mnnvl_allreduce_fusion two-shot: broadcast of the reduced tokens "
                f"(buffer {cur})")
    total = ka.tensor(bcast.copy(), name)
    if o["residual_out"]:
        total = ka.add_in(total, ctx.load(o["residual_in"], np.uint8, tokens * row), name)
        ka.store(ctx, o["residual_out"], total)
        total = ka.rms_norm(total, ctx.load(o["gamma"], np.uint8, row), name, dim, o["eps"],
                            o["weight_bias"], gamma_first=True)
    if o["output"]:
        ka.store(ctx, o["output"], total)
    # waitAndUpdate: both stages of the current buffer become dirty.
    flags[:8] = [(cur + 1) % 3, cur, per_buffer, 2, -(-tokens // n) * n * row, tokens * row,
                 0, 0]
    flags[8] = 0
