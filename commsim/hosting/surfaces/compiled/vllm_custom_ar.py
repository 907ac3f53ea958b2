"""vLLM's custom all-reduce ops (`torch.ops._C_custom_ar.*`), served over the simulated driver.

vLLM 0.33.0 registers them from `vllm/_C_stable_libtorch.abi3.so`; their schemas are declared
in extensions.py (the strings that library registers, `STABLE_TORCH_LIBRARY_FRAGMENT(
_C_custom_ar, ...)` in `csrc/torch_bindings.cpp`); each function here is one op, called with
the rank first and the op's arguments in schema order. The C++
behind them is `csrc/custom_all_reduce.cu` and `csrc/custom_all_reduce.cuh` (vLLM v0.33.0);
the steps each op takes here follow those files as read:
- `allocate_shared_buffer_and_handle(size)`: cudaMalloc on the current device, zeroed,
  and the buffer's legacy IPC handle as a 64-byte CPU uint8 tensor. `open_mem_handle`:
  cudaIpcOpenMemHandle(lazy peer access). `free_shared_buffer`: cudaFree. A failure of any
  of them is AT_CUDA_CHECK's `RuntimeError("CUDA error: <cudaGetErrorString>")`.
- `init_custom_ar(ipc_tensors, rank_data, rank, fully_connected)`: the addresses of every
  rank's signal buffer (its own and its mappings of the peers'), one per rank.
- `register_buffer(fa, ptrs)`: every rank's address of the pre-registered buffer; the
  kernel later finds them by the own address.
- `all_reduce(fa, inp, out, reg_buffer, reg_buffer_sz_bytes)`: with a reg_buffer the input
  is first copied into it (the input must fit); the buffer must be registered, except while
  the stream is captured, when the input's address is recorded as a graph buffer (its peers'
  addresses are filled in by `register_graph_buffers`, before the graph is launched). The
  kernel: a start barrier on the signal buffers (each rank stores its flag into its slot at
  every peer, then waits for every peer's flag in its own buffer), every rank's buffer read
  through this rank's address of it and summed in rank order, an end barrier.
- `get_graph_buffer_ipc_meta(fa)`: per recorded graph buffer, the IPC handle of its
  allocation's base (cuPointerGetAttribute RANGE_START_ADDR) and the offset into it; the
  handle bytes as signed chars (the std::string -> int64 conversion of the binding).
- `register_graph_buffers(fa, handles, offsets)`: opens every peer's handle (one mapping
  per distinct handle) with cudaIpcOpenMemHandle under CUDACHECK, which prints
  `Failed: Cuda error <file>:<line> '<cudaGetErrorString>'` and calls exit(EXIT_FAILURE):
  no Python exception (vllm-project/vllm#52778 shows it as
  `custom_all_reduce.cuh:143 'invalid resource handle'`; the line at 0.33.0 UNCONFIRMED).
- `dispose(fa)`: the destructor closes every handle register_graph_buffers opened.
Simulated, not modelled: the one-stage / two-stage split and block counts (every size reads
every peer's whole buffer); the Signal layout beyond its size (meta_size: sizeof(Signal),
kMaxBlocks 36 x 8 uint32 self counters and 2 x 36 x 8 peer counters = 3456 bytes,
UNCONFIRMED at 0.33.0); the rank_data capacity check. Float sums accumulate in float32 and
round once (commsim/kernels/collectives.py), UNCONFIRMED against the kernel's packed adds.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from cuda.bindings import driver as cu

from commsim.driver import IPC_HANDLE_SIZE, LAZY_ENABLE_PEER_ACCESS, error_string
from commsim.kernels.collectives import reduce_into
from commsim.runtime.scheduler import wait_until
from commsim.hosting.state.cuda_state import rank_state
from commsim.hosting.state.session import HostedRank
from commsim.hosting.surfaces.cuda import driver_api, runtime_api
from commsim.hosting.surfaces.torch import graphs as torch_graphs
from commsim.hosting.surfaces.torch.streams import current_streams
from commsim.hosting.surfaces.torch.tensors import HostedCudaTensor, inner_of

__all__ = ["SIGNAL_BYTES"]

SIGNAL_BYTES = 3456                  # sizeof(vllm::Signal), see the module docstring
_PEER_FLAGS = 1152                   # offset of peer_counter in Signal (self_counter's size)
_PHASE_BYTES = 1152                  # one peer_counter[phase] array
_DTYPES = {torch.float32: "float32", torch.float16: "float16", torch.bfloat16: "bfloat16"}
_FIRST_FA = 0x7F3A_0000_0000         # where the fake pointers of `new CustomAllreduce` start


@dataclass
class _Allreduce:
    """One `vllm::CustomAllreduce` of a rank (the object `fa` points to)."""

    rank: int
    signals: list[int]
    device: int
    buffers: dict[int, list[int]] = field(default_factory=dict)   # own address -> every rank's
    graph_unreg: list[int] = field(default_factory=list)          # captured, not yet registered
    graph: dict[int, list[int]] = field(default_factory=dict)     # own address -> every rank's
    opened: dict[bytes, int] = field(default_factory=dict)        # IPC handle -> mapping
    flag: int = 0
    # How a failing CUDA call inside the object ends: vLLM's CUDACHECK exits the process;
    # FlashInfer's copy of the object (flashinfer_vllm_ar.py) throws, text "<error>\n<file>".
    cuda_error_raises_from: str = ""

    @property
    def world_size(self) -> int:
        return len(self.signals)


@dataclass
class _RankAr:
    objects: dict[int, _Allreduce] = field(default_factory=dict)
    next_fa: int = _FIRST_FA


def _st(r: HostedRank) -> _RankAr:
    return rank_state(r, "vllm._C_custom_ar", _RankAr)


def _fa(r: HostedRank, fa: int) -> _Allreduce:
    ar = _st(r).objects.get(int(fa))
    if ar is None:
        # A dangling fptr_t is a crash in C++; named here instead.
        raise RuntimeError(f"commsim hosting: _C_custom_ar: {fa:#x} is not a live custom "
                           f"all-reduce of this rank (disposed, or another rank's)")
    return ar


def _cuda(res: tuple, what: str) -> Any:
    """AT_CUDA_CHECK: a failing runtime call is a c10 error naming the CUDA error."""
    if int(res[0]) != 0:
        raise RuntimeError(f"CUDA error: {error_string(res[0])} ({what})")
    return res[1] if len(res) > 1 else None


def _torch_check(ok: bool, text: str) -> None:
    if not ok:
        raise RuntimeError(text)


def _weak_contiguous(t: Any) -> bool:
    # csrc/custom_all_reduce.cu _is_weak_contiguous
    nbytes = t.untyped_storage().nbytes()
    return t.is_contiguous() or nbytes - t.storage_offset() * t.element_size() == \
        t.numel() * t.element_size()


# ---- shared buffers --------------------------------------------------------------------------

def meta_size(r: HostedRank) -> int:
    """sizeof(vllm::Signal): the bytes each rank reserves at the head of its signal buffer."""
    return SIGNAL_BYTES


def allocate_shared_buffer_and_handle(r: HostedRank, size: int) -> tuple[int, Any]:
    """cudaMalloc + cudaMemset + cudaIpcGetMemHandle: the pointer and its legacy IPC handle bytes."""
    ptr = _cuda(runtime_api.cudaMalloc(int(size)), "cudaMalloc")
    _cuda(runtime_api.cudaMemset(ptr, 0, int(size)), "cudaMemsetAsync")
    handle = _cuda(runtime_api.cudaIpcGetMemHandle(ptr), "cudaIpcGetMemHandle")
    blob = runtime_api.ipc_handle_bytes(handle)
    return ptr, torch.frombuffer(bytearray(blob), dtype=torch.uint8)


def open_mem_handle(r: HostedRank, mem_handle: Any) -> int:
    """cudaIpcOpenMemHandle of a peer's handle bytes (lazy peer access), as the op does."""
    blob = bytes(inner_of(mem_handle).contiguous().view(torch.uint8).numpy().tobytes())
    handle = runtime_api.ipc_handle_of(blob)
    return _cuda(runtime_api.cudaIpcOpenMemHandle(handle, LAZY_ENABLE_PEER_ACCESS),
                 "cudaIpcOpenMemHandle")


def free_shared_buffer(r: HostedRank, ptr: int) -> None:
    """cudaFree of a buffer allocate_shared_buffer_and_handle made."""
    _cuda(runtime_api.cudaFree(int(ptr)), "cudaFree")


# ---- the communicator object ---------------------------------------------------------------

def init_custom_ar(r: HostedRank, ipc_tensors: list[int], rank_data: Any, rank: int,
                   fully_connected: bool) -> int:
    """A vllm::CustomAllreduce over the peers' signal buffers; its handle (`fa`) for later ops."""
    world = len(ipc_tensors)
    # The argument checks of init_custom_ar (texts as in csrc/custom_all_reduce.cu).
    if world > 16:
        raise RuntimeError("world size > 16 is not supported")      # bound UNCONFIRMED at 0.33.0
    if world % 2 != 0:
        raise RuntimeError("Odd num gpus is not supported for now")
    if rank < 0 or rank >= world:
        raise RuntimeError("invalid rank passed in")
    _torch_check(isinstance(rank_data, HostedCudaTensor), "rank_data must be a CUDA tensor")
    st = _st(r)
    fa = st.next_fa
    st.next_fa += 0x1000
    st.objects[fa] = _Allreduce(rank, [int(p) for p in ipc_tensors], rank_data.device.index)
    return fa


def register_buffer(r: HostedRank, fa: int, ipc_tensors: list[int]) -> None:
    """Record every rank's pointer of one registered input buffer (opened by the caller)."""
    ar = _fa(r, fa)
    _torch_check(len(ipc_tensors) == ar.world_size,
                 f"Expected ipc_tensors.size() == world_size_ ({len(ipc_tensors)} vs. "
                 f"{ar.world_size})")
    ar.buffers[int(ipc_tensors[ar.rank])] = [int(p) for p in ipc_tensors]


def dispose(r: HostedRank, fa: int) -> None:
    """Close the graph buffers' IPC mappings the communicator opened, then forget it."""
    ar = _st(r).objects.pop(int(fa), None)
    if ar is None:
        return
    for ptr in ar.opened.values():
        _cudacheck(r, ar, runtime_api.cudaIpcCloseMemHandle(ptr))


def _cudacheck(r: HostedRank, ar: _Allreduce, res: tuple) -> Any:
    """CUDACHECK of custom_all_reduce.cuh: print the error and exit(EXIT_FAILURE), no Python
    exception (SystemExit is how a hosted rank's process exit is seen); for an object whose
    `cuda_error_raises_from` names a file, a RuntimeError instead."""
    if int(res[0]) != 0 and ar.cuda_error_raises_from:
        raise RuntimeError(f"{error_string(res[0])}\n{ar.cuda_error_raises_from}")
    if int(res[0]) != 0:
        sys.stdout.write(f"Failed: Cuda error csrc/custom_all_reduce.cuh '{error_string(res[0])}'\n")
        sys.stdout.flush()
        r.events.note("vLLM's CUDACHECK called exit(EXIT_FAILURE) in _C_custom_ar")
        raise SystemExit(1)
    return res[1] if len(res) > 1 else None


# ---- graph buffers ---------------------------------------------------------------------------

def get_graph_buffer_ipc_meta(r: HostedRank, fa: int) -> tuple[list[int], list[int]]:
    """Legacy IPC handles and offsets of the buffers a CUDA graph captured, for the peers."""
    ar = _fa(r, fa)
    handles: list[int] = []
    offsets: list[int] = []
    start = cu.CUpointer_attribute.CU_POINTER_ATTRIBUTE_RANGE_START_ADDR
    for ptr in ar.graph_unreg:
        err, base = driver_api.cuPointerGetAttribute(start, ptr)
        if int(err) != 0:
            raise RuntimeError("failed to get pointer attr")
        handle = _cudacheck(r, ar, runtime_api.cudaIpcGetMemHandle(int(base)))
        handles += [b - 256 if b > 127 else b for b in runtime_api.ipc_handle_bytes(handle)]
        offsets.append(ptr - int(base))
    return handles, offsets


def _open_ipc(r: HostedRank, ar: _Allreduce, blob: bytes) -> int:
    if blob not in ar.opened:
        handle = runtime_api.ipc_handle_of(blob)
        ar.opened[blob] = _cudacheck(r, ar, runtime_api.cudaIpcOpenMemHandle(
            handle, LAZY_ENABLE_PEER_ACCESS))
    return ar.opened[blob]


def register_graph_buffers(r: HostedRank, fa: int, handles: list[list[int]],
                           offsets: list[list[int]]) -> None:
    """Open every peer's graph-buffer handles (cudaIpcOpenMemHandle under CUDACHECK: across
    hosts it prints the error and exits, vLLM#52778)."""
    ar = _fa(r, fa)
    for i, own in enumerate(ar.graph_unreg):
        ptrs = []
        for j in range(ar.world_size):
            if j == ar.rank:
                ptrs.append(own)
                continue
            raw = handles[j][i * IPC_HANDLE_SIZE:(i + 1) * IPC_HANDLE_SIZE]
            blob = bytes(b & 0xFF for b in raw)
            ptrs.append(_open_ipc(r, ar, blob) + int(offsets[j][i]))
        ar.graph[own] = ptrs
    ar.graph_unreg.clear()


# ---- the kernel ------------------------------------------------------------------------------

def _flags(r: HostedRank, signal: int, phase: int, n: int) -> np.ndarray:
    return r.driver.view(signal + _PEER_FLAGS + phase * _PHASE_BYTES, 4 * n).view(np.uint32)


def _barrier(r: HostedRank, ar: _Allreduce, phase: int, flag: int, what: str) -> None:
    """Store `flag` into this rank's slot of every rank's signal buffer (through this rank's
    address of it), then wait until every slot of its own holds it."""
    for signal in ar.signals:
        _flags(r, signal, phase, ar.world_size)[ar.rank] = flag
    own = _flags(r, ar.signals[ar.rank], phase, ar.world_size)
    missing = [j for j in range(ar.world_size) if own[j] != flag]
    wait_until(lambda: bool((own == flag).all()),
               f"vLLM custom all-reduce ({what}): rank {ar.rank} of {ar.world_size} waits in the "
               f"{'start' if phase == 0 else 'end'} barrier for the flag {flag} of ranks "
               f"{missing} in its signal buffer {ar.signals[ar.rank]:#x} "
               f"(torch.ops._C_custom_ar.all_reduce)")


def _run_kernel(r: HostedRank, ar: _Allreduce, ptrs: list[int], out: Any, dtype: str) -> None:
    nbytes = out.numel() * out.element_size()
    ar.flag += 1
    _barrier(r, ar, 0, ar.flag, "inputs ready")
    acc = np.empty(nbytes, np.uint8)
    reduce_into([r.driver.view(p, nbytes) for p in ptrs], acc, dtype)
    _barrier(r, ar, 1, ar.flag, "peers read")
    r.driver.view(out.data_ptr(), nbytes)[:] = acc


def all_reduce(r: HostedRank, fa: int, inp: Any, out: Any, reg_buffer: int,
               reg_buffer_sz_bytes: int) -> None:
    """The one- or two-stage all-reduce: peers read through the opened mappings, ordered by
    the signal buffers' flags; recorded instead of run while its stream captures."""
    ar = _fa(r, fa)
    _torch_check(inp.dtype == out.dtype, f"Expected inp.scalar_type() == out.scalar_type() "
                 f"({inp.dtype} vs. {out.dtype})")
    _torch_check(inp.numel() == out.numel(), f"Expected inp.numel() == out.numel() "
                 f"({inp.numel()} vs. {out.numel()})")
    _torch_check(_weak_contiguous(out), "Expected _is_weak_contiguous(out) to be true")
    _torch_check(_weak_contiguous(inp), "Expected _is_weak_contiguous(inp) to be true")
    size = inp.numel() * inp.element_size()
    dtype = _DTYPES.get(out.dtype)
    cap = torch_graphs.capture_on(out.device.index, current_streams().get(out.device.index, 0))
    if reg_buffer:
        _torch_check(size <= reg_buffer_sz_bytes, f"Expected input_size <= reg_buffer_sz_bytes "
                     f"({size} vs. {reg_buffer_sz_bytes})")
    key = int(reg_buffer) if reg_buffer else inp.data_ptr()
    if dtype is None:
        raise RuntimeError("custom allreduce only supports float32, float16 and bfloat16")

    def copy_in() -> None:
        if reg_buffer:
            r.driver.view(key, size)[:] = r.driver.view(inp.data_ptr(), size)

    if cap is not None:
        # Captured: recorded into the graph; the peers' addresses of the input are those
        # register_graph_buffers fills in, read when the graph is launched.
        if key not in ar.buffers:
            ar.graph_unreg.append(key)

        def launch() -> None:
            copy_in()
            ptrs = ar.buffers.get(key) or ar.graph.get(key)
            if ptrs is None:
                raise RuntimeError(f"commsim hosting: _C_custom_ar.all_reduce launched from a "
                                   f"graph whose buffer {key:#x} was never registered "
                                   f"(register_graph_buffers was not called)")
            _run_kernel(r, ar, ptrs, out, dtype)
        cap.work.append(launch)
        return
    copy_in()
    ptrs = ar.buffers.get(key) or ar.graph.get(key)
    if ptrs is None:
        raise RuntimeError(f"buffer address {key} is not registered!")
    _run_kernel(r, ar, ptrs, out, dtype)
