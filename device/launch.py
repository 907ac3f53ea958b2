"""From a simulator kernel call to a CUDA launch: entry point, grid and packed parameters.

The backends call `driver.launch_kernel(K.one_shot_all_reduce, ptrs, me, n, dtype, capacity,
round)` with the functions of commsim/kernels/collectives.py. On the simulator that runs
the Python function; CudaDriver looks the function's *name* up here and launches the .cu
entry point of the same algorithm (device/kernels/peer.cu, multimem.cu) with the same
arguments. Kernels that exist only on the device (the fused RMSNorm, `read_bytes`) are
launched by name (a string in place of the function).

Pure Python: planning a launch needs no GPU, so the argument checks are tested on CPU.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from commsim.kernels.workspace import MAX_RANKS  # = kernels/commsim_common.cuh

THREADS = 512                     # __launch_bounds__ of every entry point
DTYPES = {"float32": ("f32", 4), "float16": ("f16", 2), "bfloat16": ("bf16", 2)}


class Peers(ctypes.Structure):
    """`struct Peers` of commsim_common.cuh: every rank's workspace base, by value."""

    _fields_ = [("ptr", ctypes.c_uint64 * MAX_RANKS)]


class LaunchError(ValueError):
    """Arguments no kernel can run with; the driver answers cudaErrorInvalidValue."""


@dataclass
class Launch:
    unit: str                     # "peer" | "multimem" (device/build.py UNITS)
    entry: str                    # extern "C" name in the unit
    grid: int
    block: int
    params: list[Any]             # ctypes objects, in the entry point's parameter order

    def param_array(self) -> ctypes.Array:
        """The `void**` cuLaunchKernel takes; keep `self` alive while it is used."""
        return (ctypes.c_void_p * len(self.params))(*[ctypes.addressof(p) for p in self.params])


def _dtype(dtype: Any) -> tuple[str, int]:
    name = str(dtype).removeprefix("torch.")
    if name not in DTYPES:
        raise LaunchError(f"dtype {dtype!r}: the kernels support {', '.join(DTYPES)}")
    return DTYPES[name]


def _peers(ptrs: Sequence[int], me: int) -> Peers:
    ws = len(ptrs)
    if not 1 <= ws <= MAX_RANKS:
        raise LaunchError(f"{ws} ranks: the kernels take 1..{MAX_RANKS}")
    if not 0 <= int(me) < ws:
        raise LaunchError(f"rank {me} is not in 0..{ws - 1}")
    p = Peers()
    for i, v in enumerate(ptrs):
        if not 0 < int(v) < 1 << 64:
            raise LaunchError(f"workspace pointer of rank {i} is {v!r}")
        p.ptr[i] = int(v)
    return p


def _count(name: str, v: Any) -> int:
    v = int(v)
    if not 0 <= v < 1 << 63:
        raise LaunchError(f"{name} = {v} is out of range")
    return v


def _round(rnd: Any) -> ctypes.c_uint32:
    r = int(rnd)
    if not 0 < r < 1 << 32:
        raise LaunchError(f"round {r}: flags are uint32 round numbers starting at 1")
    return ctypes.c_uint32(r)


def _grid(units: int, sm_count: int) -> int:
    # At most one block per SM: the two-shot MID wait needs the whole grid resident, and one
    # 512-thread block (<= 128 registers per thread, from __launch_bounds__) always fits.
    return max(1, min(sm_count, -(-units // THREADS)))


def _fits(nbytes: int, capacity: int, what: str) -> None:
    if nbytes > capacity:
        raise LaunchError(f"{what}: {nbytes} B do not fit the {capacity} B workspace capacity")


def _peer_reduce(entry: str) -> Callable[..., Launch]:
    def plan(sm_count: int, ptrs: Sequence[int], me: int, n: int, dtype: str, capacity: int,
             rnd: int) -> Launch:
        suffix, esz = _dtype(dtype)
        n, cap = _count("n", n), _count("capacity", capacity)
        _fits(n * esz, cap, entry)
        peers = _peers(ptrs, me)
        return Launch("peer", f"{entry}_{suffix}", _grid(-(-n * esz // 16), sm_count), THREADS,
                      [peers, ctypes.c_int(len(ptrs)), ctypes.c_int(int(me)),
                       ctypes.c_uint64(n), ctypes.c_uint64(cap), _round(rnd)])
    return plan


def _all_gather(sm_count: int, ptrs: Sequence[int], me: int, nbytes: int, capacity: int,
                rnd: int) -> Launch:
    nbytes, cap = _count("nbytes", nbytes), _count("capacity", capacity)
    _fits(nbytes * len(ptrs), cap, "all_gather")
    peers = _peers(ptrs, me)
    return Launch("peer", "all_gather", _grid(-(-nbytes * len(ptrs) // 16), sm_count), THREADS,
                  [peers, ctypes.c_int(len(ptrs)), ctypes.c_int(int(me)),
                   ctypes.c_uint64(nbytes), ctypes.c_uint64(cap), _round(rnd)])


def _multimem(sm_count: int, mc: int, uc: int, me: int, ws: int, n: int, dtype: str,
              capacity: int, rnd: int) -> Launch:
    suffix, esz = _dtype(dtype)
    n, cap, ws = _count("n", n), _count("capacity", capacity), int(ws)
    if cap % 16:
        raise LaunchError(f"capacity {cap} B: the multimem kernel moves 16-byte units and "
                          f"needs a capacity that is a multiple of 16")
    _fits(-(-n * esz // 16) * 16, cap, "multimem_all_reduce")
    if not 1 <= ws <= MAX_RANKS or not 0 <= int(me) < ws:
        raise LaunchError(f"rank {me} of {ws}: the kernels take 1..{MAX_RANKS} ranks")
    if not int(mc) or not int(uc):
        raise LaunchError("multicast and unicast addresses must both be mapped")
    units = -(-n * esz // 16)
    return Launch("multimem", f"multimem_all_reduce_{suffix}", _grid(-(-units // ws), sm_count),
                  THREADS, [ctypes.c_uint64(int(mc)), ctypes.c_uint64(int(uc)),
                            ctypes.c_int(int(me)), ctypes.c_int(ws), ctypes.c_uint64(n),
                            ctypes.c_uint64(cap), _round(rnd)])


def _rmsnorm(sm_count: int, ptrs: Sequence[int], me: int, rows: int, hidden: int, dtype: str,
             capacity: int, rnd: int, residual_in: int, residual_out: int, weight: int,
             eps: float) -> Launch:
    suffix, esz = _dtype(dtype)
    rows, hidden, cap = _count("rows", rows), _count("hidden", hidden), _count("capacity", capacity)
    if hidden == 0:
        raise LaunchError("hidden size 0")
    _fits(rows * hidden * esz, cap, "fused_all_reduce_rmsnorm")
    if int(residual_in) == int(residual_out):
        raise LaunchError("residual_out must not alias residual_in (the kernel re-reads it)")
    peers = _peers(ptrs, me)
    return Launch("peer", f"fused_all_reduce_rmsnorm_{suffix}", max(1, min(sm_count, rows)),
                  THREADS, [peers, ctypes.c_int(len(ptrs)), ctypes.c_int(int(me)),
                            ctypes.c_uint64(rows), ctypes.c_uint64(hidden), ctypes.c_uint64(cap),
                            _round(rnd), ctypes.c_uint64(int(residual_in)),
                            ctypes.c_uint64(int(residual_out)), ctypes.c_uint64(int(weight)),
                            ctypes.c_float(float(eps))])


def _read_bytes(sm_count: int, src: int, dst: int, nbytes: int) -> Launch:
    nbytes = _count("nbytes", nbytes)
    return Launch("peer", "read_bytes", _grid(-(-nbytes // 16), sm_count), THREADS,
                  [ctypes.c_uint64(int(src) & (1 << 64) - 1), ctypes.c_uint64(int(dst)),
                   ctypes.c_uint64(nbytes)])


# Simulator kernel name (commsim/kernels/collectives.py) or device-only name -> planner.
PLANNERS: dict[str, Callable[..., Launch]] = {
    "one_shot_all_reduce": _peer_reduce("one_shot_all_reduce"),
    "two_shot_all_reduce": _peer_reduce("two_shot_all_reduce"),
    "reduce_scatter": _peer_reduce("reduce_scatter"),
    "all_gather": _all_gather,
    "multimem_all_reduce": _multimem,
    "fused_all_reduce_rmsnorm": _rmsnorm,
    "read_bytes": _read_bytes,
}


def kernel_name(kernel: Any) -> str:
    return kernel if isinstance(kernel, str) else getattr(kernel, "__name__", repr(kernel))


def plan(kernel: Any, args: Sequence[Any], sm_count: int) -> Launch:
    """The launch for `kernel` (a sim kernel function or a device kernel name) with the
    simulator's arguments. Raises KeyError for a kernel with no device twin, LaunchError
    for arguments it cannot run with."""
    name = kernel_name(kernel)
    planner = PLANNERS.get(name)
    if planner is None:
        raise KeyError(f"no device kernel for {name!r}; known: {', '.join(PLANNERS)}")
    try:
        return planner(sm_count, *args)
    except TypeError as e:
        raise LaunchError(f"{name}: {e}") from None
