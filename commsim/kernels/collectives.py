"""Reference collective kernels over peer pointers and multicast addresses (DESIGN.md §5).

The simulator runs them through `launch_kernel` with a KernelContext over simulated memory;
device/kernels/*.cu are their CUDA twins, with the same workspace layout (`workspace`) and
the same flag protocol. A round is one launch; flags carry the round number, so no flag is
ever reset (the barrier pattern of vLLM's custom all-reduce: every rank stores `round` into
its slot at every peer, then spins until every peer's slot in its own flags reaches `round`).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import torch

from .context import KernelContext
from .workspace import DATA, END, MID, START, chunks as _chunks

TORCH_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def _t(view: np.ndarray, dtype: torch.dtype) -> torch.Tensor:
    return torch.from_numpy(view).view(dtype)


def _barrier(ctx: KernelContext, ptrs: Sequence[int], me: int, which: int, rnd: int, what: str) -> None:
    for p in ptrs:
        ctx.signal(p + which + 4 * me, rnd)
    for j in range(len(ptrs)):
        ctx.wait(ptrs[me] + which + 4 * j, rnd, f"{what}: flag of rank {j} (round {rnd})")


def one_shot_all_reduce(ctx: KernelContext, ptrs: Sequence[int], me: int, n: int, dtype: str,
                        capacity: int, rnd: int) -> None:
    """Every rank reads every peer's whole input and sums in float32 (vLLM 1-stage)."""
    dt = TORCH_DTYPES[dtype]
    esz = torch.empty(0, dtype=dt).element_size()
    _barrier(ctx, ptrs, me, START, rnd, "one-shot start")
    acc = torch.zeros(n, dtype=torch.float32)
    for p in ptrs:
        acc += _t(ctx.array(p + DATA, np.uint8, n * esz), dt).float()
    _t(ctx.array(ptrs[me] + DATA + capacity, np.uint8, n * esz), dt).copy_(acc.to(dt))
    _barrier(ctx, ptrs, me, END, rnd, "one-shot end")


def two_shot_all_reduce(ctx: KernelContext, ptrs: Sequence[int], me: int, n: int, dtype: str,
                        capacity: int, rnd: int) -> None:
    """Reduce-scatter (rank i reduces chunk i) then all-gather of the reduced chunks."""
    dt = TORCH_DTYPES[dtype]
    esz = torch.empty(0, dtype=dt).element_size()
    ch = _chunks(n, len(ptrs))
    lo, hi = ch[me]
    _barrier(ctx, ptrs, me, START, rnd, "two-shot start")
    acc = torch.zeros(hi - lo, dtype=torch.float32)
    for p in ptrs:
        acc += _t(ctx.array(p + DATA + lo * esz, np.uint8, (hi - lo) * esz), dt).float()
    _t(ctx.array(ptrs[me] + DATA + capacity + lo * esz, np.uint8, (hi - lo) * esz), dt).copy_(acc.to(dt))
    _barrier(ctx, ptrs, me, MID, rnd, "two-shot middle")
    for j, (a, b) in enumerate(ch):
        if j != me and b > a:
            src = ctx.array(ptrs[j] + DATA + capacity + a * esz, np.uint8, (b - a) * esz)
            ctx.array(ptrs[me] + DATA + capacity + a * esz, np.uint8, (b - a) * esz)[:] = src
    _barrier(ctx, ptrs, me, END, rnd, "two-shot end")


def all_gather(ctx: KernelContext, ptrs: Sequence[int], me: int, nbytes: int, capacity: int,
               rnd: int) -> None:
    """Rank j's input lands at offset j * nbytes of every rank's scratch."""
    _barrier(ctx, ptrs, me, START, rnd, "all-gather start")
    for j, p in enumerate(ptrs):
        ctx.array(ptrs[me] + DATA + capacity + j * nbytes, np.uint8, nbytes)[:] = \
            ctx.array(p + DATA, np.uint8, nbytes)
    _barrier(ctx, ptrs, me, END, rnd, "all-gather end")


def reduce_scatter(ctx: KernelContext, ptrs: Sequence[int], me: int, n: int, dtype: str,
                   capacity: int, rnd: int) -> None:
    """Rank i gets chunk i (n // ws elements) of the sum, at the start of its scratch."""
    dt = TORCH_DTYPES[dtype]
    esz = torch.empty(0, dtype=dt).element_size()
    per = n // len(ptrs)
    _barrier(ctx, ptrs, me, START, rnd, "reduce-scatter start")
    acc = torch.zeros(per, dtype=torch.float32)
    for p in ptrs:
        acc += _t(ctx.array(p + DATA + me * per * esz, np.uint8, per * esz), dt).float()
    _t(ctx.array(ptrs[me] + DATA + capacity, np.uint8, per * esz), dt).copy_(acc.to(dt))
    _barrier(ctx, ptrs, me, END, rnd, "reduce-scatter end")


def multimem_all_reduce(ctx: KernelContext, mc: int, uc: int, me: int, ws: int, n: int,
                        dtype: str, capacity: int, rnd: int) -> None:
    """NVLS-style: rank i multimem.ld_reduce's chunk i over the multicast address and
    multimem.st's it back to every member; flags travel by multicast stores too."""
    dt = TORCH_DTYPES[dtype]
    esz = torch.empty(0, dtype=dt).element_size()

    def mc_barrier(which: int, what: str) -> None:
        for v in ctx.multimem(mc + which + 4 * me, np.uint32, 1):
            v[0] = rnd
        for j in range(ws):
            ctx.wait(uc + which + 4 * j, rnd, f"{what}: flag of rank {j} (round {rnd})")

    mc_barrier(START, "multimem start")
    lo, hi = _chunks(n, ws)[me]
    if hi > lo:
        members = ctx.multimem(mc + DATA + lo * esz, np.uint8, (hi - lo) * esz)
        acc = torch.zeros(hi - lo, dtype=torch.float32)
        for v in members:
            acc += _t(v, dt).float()
        out = acc.to(dt)
        for v in ctx.multimem(mc + DATA + capacity + lo * esz, np.uint8, (hi - lo) * esz):
            _t(v, dt).copy_(out)
    mc_barrier(END, "multimem end")
