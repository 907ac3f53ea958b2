"""What every served op of a compiled extension shares: running its reference kernel in the
calling rank's simulated process, reading the arguments a kernel reads (tensors by their
device address, pointer tables in device memory), the element types the kernels dispatch on,
and the arithmetic of their vector types.

A reference kernel runs through `SimDriver.launch_kernel`, so every load and store goes
through the mappings the program opened (an unmapped, freed or access-less range faults) and
every spin waits through the scheduler (a peer that never arrives is a diagnosed hang). A
fault does not fail the launch: on a GPU it surfaces at the next synchronising call and the
context stays unusable (CUDA C Programming Guide, "Error Checking": errors of asynchronous
work are reported by a later call; an illegal address is sticky), so here it makes the
process's error sticky and the op returns.
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np
import torch

from commsim.kernels.context import KernelContext
from commsim.runtime.scheduler import wait_until
from commsim.hosting.state.session import current

__all__ = ["ELEMENT", "NEG_ZERO", "element", "launch", "pointers", "address", "raw", "wait_for",
           "tensor", "dtype", "sum_ranks", "add_in", "rms_norm", "store"]

# The element types the comm kernels dispatch on (DISPATCH_FLOATING_TYPES_FOR_ALLREDUCE in
# csrc/trtllm_allreduce.cu and csrc/trtllm_mnnvl_allreduce.cu): torch dtype -> (name, bytes).
ELEMENT: dict[torch.dtype, tuple[str, int]] = {
    torch.float32: ("float32", 4), torch.float16: ("float16", 2), torch.bfloat16: ("bfloat16", 2)}
# Negative zero, the Lamport "not yet written" value (neg_zero<T> in
# include/flashinfer/comm/trtllm_allreduce_fusion.cuh): raw bits by element size.
NEG_ZERO = {2: np.uint16(0x8000), 4: np.uint32(0x80000000)}
_RAW = {2: np.uint16, 4: np.uint32}
_TORCH = {name: dtype for dtype, (name, _) in ELEMENT.items()}


def element(dtype: Any, what: str) -> tuple[str, int]:
    """(name, bytes) of a dispatched element type; any other is the kernel's own refusal
    (TVM_FFI_LOG_AND_THROW(NotImplementedError), which tvm-ffi raises as NotImplementedError)."""
    e = ELEMENT.get(dtype)
    if e is None:
        raise NotImplementedError(f"Unsupported dtype in {what}.")
    return e


def launch(kernel: Callable[..., None], *args: Any) -> None:
    """Run `kernel(ctx, *args)` on the calling rank's current device."""
    driver = current().driver
    res = driver.launch_kernel(kernel, *args)
    code = res[0]
    if int(code) != 0 and driver.proc.sticky is None:
        driver.proc.sticky = code


def address(t: Any) -> int:
    """The device address a kernel gets for a tensor argument (`TensorView::data_ptr()`)."""
    return int(t.data_ptr())


def pointers(ctx: KernelContext, ptr: int, count: int) -> list[int]:
    """`count` 64-bit device pointers stored at device address `ptr` (a kernel's
    `void** workspace`), read through the caller's mappings."""
    return [int(p) for p in ctx.load(ptr, np.int64, count)]


def raw(view: np.ndarray, esz: int) -> np.ndarray:
    return view.view(_RAW[esz])


def wait_for(pred: Callable[[], bool], what: str) -> None:
    """A kernel's spin loop: the rank waits (others run) until `pred()` holds."""
    wait_until(pred, what)


def tensor(a: np.ndarray, name: str) -> torch.Tensor:
    """Raw bytes of `name` as a CPU tensor of that type (a copy when read-only)."""
    t = torch.from_numpy(a if a.flags.writeable else a.copy())
    return t.view(_TORCH[name])


def dtype(name: str) -> torch.dtype:
    """The torch dtype of a dispatched element type's name."""
    return _TORCH[name]


def sum_ranks(vals: list[np.ndarray], name: str, fp32_acc: bool) -> torch.Tensor:
    """The sum of every rank's values (raw bytes of `name`), in rank order: accumulated in
    float32 and rounded once (`fp32_acc`, and always for float32), else added pairwise in the
    element type, each add rounded (vec_add of T, as allreduce_sum without Fp32Acc)."""
    ts = [tensor(v, name) for v in vals]
    if fp32_acc or name == "float32":
        acc = ts[0].float()
        for t in ts[1:]:
            acc = acc + t.float()
        return acc.to(ts[0].dtype)
    acc = ts[0].clone()
    for t in ts[1:]:
        acc = acc + t
    return acc


def add_in(val: torch.Tensor, other: np.ndarray, name: str) -> torch.Tensor:
    """val + other in the element type (vec_add of T; a residual add)."""
    return val + tensor(other, name)


def rms_norm(val: torch.Tensor, gamma: np.ndarray, name: str, hidden: int, eps: float,
             weight_bias: float, gamma_first: bool = False) -> torch.Tensor:
    """RMSNorm per token as the fused kernels compute it: the float32 sum of squares of the
    token, s = rsqrt(sum / hidden + eps), out = T(v * s * (weight_bias + gamma)), all in
    float32; with `gamma_first` the product is taken as T((weight_bias + gamma) * v * s)
    (the MNNVL rmsNormLamport kernel's order). The order of the block reduction's float adds
    is the GPU's and not pinned down here (UNCONFIRMED: a last-bit difference in s is
    possible)."""
    v = val.float().view(-1, hidden)
    s = torch.rsqrt((v * v).sum(dim=1, keepdim=True) / hidden + np.float32(eps))
    g = np.float32(weight_bias) + tensor(gamma, name).float()
    out = g * v * s if gamma_first else v * s * g
    return out.to(val.dtype).view(-1)


def store(ctx: KernelContext, ptr: int, value: torch.Tensor) -> None:
    """A kernel's vector stores of `value` at device address `ptr`."""
    data = value.contiguous().view(torch.uint8).numpy()
    ctx.array(ptr, np.uint8, data.size)[:] = data
