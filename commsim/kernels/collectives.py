"""Reference collective kernels over peer pointers and multicast addresses.

The simulator runs them through `launch_kernel` with a KernelContext over simulated memory;
device/kernels/*.cu are their CUDA twins, with the same workspace layout (`workspace`) and
the same flag protocol. A round is one launch; flags carry the round number, so no flag is
ever reset (the barrier pattern of vLLM's custom all-reduce: every rank stores `round` into
its slot at every peer, then spins until every peer's slot in its own flags reaches `round`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

import numpy as np

from commsim.kernels.context import KernelContext
from commsim.kernels.workspace import DATA, END, MID, START, chunks as _chunks

# torch is imported where a kernel uses it, not here: the backends import this module, and the
# launcher of `exec` / `sweep --exec` imports the backends without ever running a kernel.
if TYPE_CHECKING:
    import torch

ESIZE = {"float32": 4, "float16": 2, "bfloat16": 2}


def torch_dtype(name: str) -> "torch.dtype":
    """The torch dtype of one of the kernels' dtype names (float32, float16, bfloat16)."""
    import torch
    return {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}[name]


def _t(view: np.ndarray, dtype: "torch.dtype") -> "torch.Tensor":
    """A torch view of raw bytes (for kernels written with torch, such as the planted defects
    of tests/sweep/test_defects.py)."""
    import torch
    return torch.from_numpy(view).view(dtype)


def _barrier(ctx: KernelContext, ptrs: Sequence[int], me: int, which: int, rnd: int, what: str) -> None:
    ctx.signal_all(ptrs, which + 4 * me, rnd)
    ctx.wait_all(ctx.array(ptrs[me] + which, np.uint32, len(ptrs)), rnd,
                 lambda j: f"{what}: flag of rank {j} (round {rnd})")


# -- arithmetic: numpy over raw bytes, accumulating in float32 ------------------
# A bfloat16 is the high half of a float32, so widening is a 16-bit shift and narrowing a
# round-to-nearest-even on the low half, both plain integer passes that do not depend on
# torch's thread setting (torch's casts run at numpy-add speed on one thread, but about 50
# times slower with its 2-thread pool: set_torch_threads). numpy's own float16 casts take
# about 14 float32 adds here (no F16C path); torch's are vectorised, so from TORCH_F16_FROM
# elements on, on one torch thread, float16 is widened and narrowed by torch: 8 inputs of
# 32 Ki elements summed in 50 us instead of 472, stored in 2.6 us instead of 56. The values
# are the same (each input widened exactly, float32 adds in order, one round-to-nearest-even
# at the store; NaN payloads aside); below it torch's per-call cost is more than numpy's.
_NP = {"float32": np.float32, "float16": np.float16, "bfloat16": np.uint16}
_BLOCK = 1 << 16        # elements per block of a 16-bit reduction (float32 accumulator: 256 KiB)
TORCH_F16_FROM = 2048


def _torch_f16(n: int) -> bool:
    if n < TORCH_F16_FROM:
        return False
    import torch
    return torch.get_num_threads() == 1


def _tensor(a: np.ndarray) -> "torch.Tensor":
    import torch
    # torch.from_numpy warns about a read-only array (an input shared between buffers): copy it.
    return torch.from_numpy(a if a.flags.writeable else a.copy())


def store_rounded(acc: np.ndarray, dst: np.ndarray, dtype: str) -> None:
    """dst (raw bytes in `dtype`) = acc (float32), rounded to nearest even like a GPU cvt.rn."""
    if dtype == "float16" and _torch_f16(acc.size):
        import torch
        torch.from_numpy(dst.view(np.float16)).copy_(torch.from_numpy(acc))
        return
    if dtype != "bfloat16":
        np.copyto(dst.view(_NP[dtype]), acc, casting="same_kind")
        return
    u = acc.view(np.uint32)
    r = np.right_shift(u, 16)
    np.bitwise_and(r, 1, out=r)
    np.add(r, 0x7FFF, out=r)
    np.add(r, u, out=r)
    np.right_shift(r, 16, out=r)
    out = dst.view(np.uint16)
    np.copyto(out, r, casting="unsafe")
    nan = np.isnan(acc)
    if nan.any():
        out[nan] = 0x7FC0          # a quiet NaN, as cvt.rn.bf16.f32 gives


def _reduce(srcs: Sequence[np.ndarray], dtype: str, out: np.ndarray | None = None) -> np.ndarray:
    """The float32 sum of the `srcs` (raw bytes in `dtype`), in order, in the passes numpy's
    own sum would make: the first two inputs are added straight into the accumulator (no copy
    pass first), each further one is added in place. `out`: float32 memory to accumulate in
    (a float32 kernel sums straight into its result)."""
    nt = _NP[dtype]
    vs = [s.view(nt) for s in srcs]
    acc = out if out is not None else np.empty(vs[0].size, np.float32)
    if dtype == "bfloat16":
        # Widen each input by a 16-bit shift into one scratch array reused for every input
        # (a fresh one per input cost an allocation, and its page faults, per rank per round).
        np.left_shift(vs[0], 16, out=acc.view(np.uint32), dtype=np.uint32)
        if len(vs) > 1:
            wide = np.empty(acc.size, np.uint32)
            for v in vs[1:]:
                np.left_shift(v, 16, out=wide, dtype=np.uint32)
                np.add(acc, wide.view(np.float32), out=acc)
        return acc
    if dtype == "float16" and _torch_f16(acc.size):
        import torch
        t = torch.from_numpy(acc)
        t.copy_(_tensor(vs[0]))
        for v in vs[1:]:
            t.add_(_tensor(v))           # float32 += float16: widened, then a float32 add
        return acc
    if len(vs) == 1:
        np.copyto(acc, vs[0])
        return acc
    # dtype=float32: a float16 pair is widened before the add, never summed in float16.
    np.add(vs[0], vs[1], out=acc, dtype=np.float32)
    for v in vs[2:]:
        np.add(acc, v, out=acc, dtype=np.float32)
    return acc


def reduce_into(srcs: Sequence[np.ndarray], dst: np.ndarray, dtype: str) -> None:
    """dst (raw bytes in `dtype`) = the float32 sum of `srcs`, rounded once. In float32 the
    sum accumulates in dst itself: the passes numpy would make, no temporary. The partial sums
    sit in this rank's own result range, which no peer reads before the next barrier."""
    if dtype == "float32":
        _reduce(srcs, dtype, out=dst.view(np.float32))
        return
    # 16-bit: block by block, so the float32 accumulator and the widening and rounding scratch
    # stay in the core's cache through the ~20 passes, and nothing of the message's size is
    # allocated (whose page faults cost more than the sum). Each element still gets the same
    # additions in the same order and one rounding: the bytes are those of an unblocked sum.
    n = dst.size // 2
    acc = np.empty(min(n, _BLOCK), np.float32)
    for lo in range(0, n, _BLOCK):
        hi = min(n, lo + _BLOCK)
        part = _reduce([s[2 * lo:2 * hi] for s in srcs], dtype, out=acc[:hi - lo])
        store_rounded(part, dst[2 * lo:2 * hi], dtype)


def one_shot_all_reduce(ctx: KernelContext, ptrs: Sequence[int], me: int, n: int, dtype: str,
                        capacity: int, rnd: int) -> None:
    """Every rank reads every peer's whole input and sums in float32 (vLLM 1-stage)."""
    esz = ESIZE[dtype]
    _barrier(ctx, ptrs, me, START, rnd, "one-shot start")
    if n:
        reduce_into([ctx.load(p + DATA, np.uint8, n * esz) for p in ptrs],
                     ctx.array(ptrs[me] + DATA + capacity, np.uint8, n * esz), dtype)
    _barrier(ctx, ptrs, me, END, rnd, "one-shot end")


def two_shot_all_reduce(ctx: KernelContext, ptrs: Sequence[int], me: int, n: int, dtype: str,
                        capacity: int, rnd: int) -> None:
    """Reduce-scatter (rank i reduces chunk i) then all-gather of the reduced chunks."""
    esz = ESIZE[dtype]
    ch = _chunks(n, len(ptrs))
    lo, hi = ch[me]
    _barrier(ctx, ptrs, me, START, rnd, "two-shot start")
    if hi > lo:
        reduce_into([ctx.load(p + DATA + lo * esz, np.uint8, (hi - lo) * esz) for p in ptrs],
                     ctx.array(ptrs[me] + DATA + capacity + lo * esz, np.uint8, (hi - lo) * esz), dtype)
    _barrier(ctx, ptrs, me, MID, rnd, "two-shot middle")
    for j, (a, b) in enumerate(ch):
        if j != me and b > a:
            src = ctx.load(ptrs[j] + DATA + capacity + a * esz, np.uint8, (b - a) * esz)
            ctx.array(ptrs[me] + DATA + capacity + a * esz, np.uint8, (b - a) * esz)[:] = src
    _barrier(ctx, ptrs, me, END, rnd, "two-shot end")


def all_gather(ctx: KernelContext, ptrs: Sequence[int], me: int, nbytes: int, capacity: int,
               rnd: int) -> None:
    """Rank j's input lands at offset j * nbytes of every rank's scratch."""
    _barrier(ctx, ptrs, me, START, rnd, "all-gather start")
    for j, p in enumerate(ptrs):
        ctx.array(ptrs[me] + DATA + capacity + j * nbytes, np.uint8, nbytes)[:] = \
            ctx.load(p + DATA, np.uint8, nbytes)
    _barrier(ctx, ptrs, me, END, rnd, "all-gather end")


def reduce_scatter(ctx: KernelContext, ptrs: Sequence[int], me: int, n: int, dtype: str,
                   capacity: int, rnd: int) -> None:
    """Rank i gets chunk i (n // ws elements) of the sum, at the start of its scratch."""
    esz = ESIZE[dtype]
    per = n // len(ptrs)
    _barrier(ctx, ptrs, me, START, rnd, "reduce-scatter start")
    if per:
        reduce_into([ctx.load(p + DATA + me * per * esz, np.uint8, per * esz) for p in ptrs],
                     ctx.array(ptrs[me] + DATA + capacity, np.uint8, per * esz), dtype)
    _barrier(ctx, ptrs, me, END, rnd, "reduce-scatter end")


def multimem_all_reduce(ctx: KernelContext, mc: int, uc: int, me: int, ws: int, n: int,
                        dtype: str, capacity: int, rnd: int) -> None:
    """NVLS-style: rank i multimem.ld_reduce's chunk i over the multicast address and
    multimem.st's it back to every member; flags travel by multicast stores too."""
    esz = ESIZE[dtype]

    def mc_barrier(which: int, what: str) -> None:
        for v in ctx.multimem(mc + which + 4 * me, np.uint32, 1):
            v[0] = rnd
        ctx.wait_all(ctx.array(uc + which, np.uint32, ws), rnd,
                     lambda j: f"{what}: flag of rank {j} (round {rnd})")

    mc_barrier(START, "multimem start")
    lo, hi = _chunks(n, ws)[me]
    if hi > lo:
        nbytes = (hi - lo) * esz
        out = np.empty(nbytes, np.uint8)
        reduce_into(ctx.multimem_load(mc + DATA + lo * esz, np.uint8, nbytes), out, dtype)
        ctx.multimem_store(mc + DATA + capacity + lo * esz, out)   # the same bytes to every member
    mc_barrier(END, "multimem end")
