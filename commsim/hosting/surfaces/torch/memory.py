"""The device memory behind a hosted rank's CUDA tensors.

A CUDA tensor of a hosted rank keeps its elements in the rank's simulated device memory: its
storage is a block of a caching allocator (commsim/libmodels/caching_allocator.py, PyTorch's size
classes and splitting) over the rank's SimDriver, one allocator per device as PyTorch keeps
per-device pools, so `data_ptr()` is a simulated device address inside a `cudaMalloc`
segment, as on a GPU. The bytes are not copied: the SimDriver backs every allocation with
host memory (an anonymous mapping in inproc mode, a /dev/shm file in procs mode:
commsim/sim/host_memory.py, shm.py), and the tensor's CPU storage *is* that memory
(`torch.from_numpy` over the driver's view of the block). A write through torch is what a
peer's `cudaIpcOpenMemHandle` mapping, `cudaMemcpy` and the simulated kernels read, and the
other way round, with nothing to keep coherent.

A block goes back to its allocator when the last tensor over it is collected (the storage
drops the driver's view); its segment stays cached, as in PyTorch, until `empty_cache()` or
the rank's exit, which hands every segment back to the driver (real process teardown frees
the cache the same way), so the verdict's residue lists what the program itself leaked.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from commsim.libmodels.caching_allocator import CachingAllocator
from commsim.driver import CudaError
from commsim.hosting.state.cuda_state import rank_state
from commsim.hosting.state.session import HostedRank

KEY = "torch.tensors"


@dataclass(eq=False)
class DeviceBlock:
    """One allocator block backing one storage: where its bytes are on the device (`ptr`)
    and in this process (`host`, the address torch's CPU storage starts at)."""

    ptr: int
    nbytes: int
    device: int
    host: int
    clock: list[int] = field(default_factory=lambda: [0])   # the device's op clock (below)

    def device_address(self, host_addr: int) -> int:
        return self.ptr + (host_addr - self.host)


@dataclass
class RankMemory:
    """Per rank: an allocator per device (it keeps torch.cuda's statistics,
    torch/cuda_memory.py reads them) and the raw blocks of caching_allocator_alloc."""

    allocators: dict[int, CachingAllocator] = field(default_factory=dict)
    raw: dict[int, int] = field(default_factory=dict)            # raw block ptr -> device
    # device -> [ops dispatched on its tensors]: the simulated clock torch.cuda.Event reads
    # (torch/streams.py); shared by reference with every block of the device.
    clocks: dict[int, list[int]] = field(default_factory=dict)
    closed: bool = False


def _memory(r: HostedRank) -> RankMemory:
    return rank_state(r, KEY, RankMemory)


def _allocator(r: HostedRank, mem: RankMemory, device: int) -> CachingAllocator:
    a = mem.allocators.get(device)
    if a is None:
        # The allocator's segments are cudaMalloc'd on the driver's current device.
        a = mem.allocators[device] = CachingAllocator(r.driver)
        _release_at_exit(r, mem)
    return a


def _release_at_exit(r: HostedRank, mem: RankMemory) -> None:
    """Hand the cached segments back before the process's exit is judged (only once)."""
    if getattr(mem, "_hooked", False):
        return
    mem._hooked = True      # type: ignore[attr-defined]
    before_exit(r, lambda: close(r))


def before_exit(r: HostedRank, fn: Any) -> bool:
    """Run `fn` when the rank's process exits, before its exit is judged (after any hook
    registered before); False where the driver has no process exit to hook."""
    inner = getattr(r.driver, "inner", r.driver)
    fabric, pid = getattr(inner, "fabric", None), getattr(getattr(inner, "proc", None), "pid", None)
    if fabric is None or pid is None:
        return False
    prev = fabric.pre_exit_hooks.get(pid)

    def hook() -> None:
        fn()
        if prev is not None:
            prev()
    fabric.pre_exit_hooks[pid] = hook
    return True


def _with_device(r: HostedRank, device: int, fn: Any) -> Any:
    d = r.driver
    prev = int(d.cudaGetDevice()[1])
    if prev != device and int(d.cudaSetDevice(device)[0]) != 0:
        import torch
        raise torch.AcceleratorError("CUDA error: invalid device ordinal")
    try:
        return fn()
    finally:
        if prev != device:
            d.cudaSetDevice(prev)


def allocate(r: HostedRank, device: int, nbytes: int) -> tuple[Any, DeviceBlock | None]:
    """A 1-D uint8 CPU tensor whose storage is `nbytes` of device memory on `device`, and the
    block (None for 0 bytes: PyTorch gives an empty tensor a null data pointer)."""
    import torch
    if nbytes == 0:
        return torch.empty(0, dtype=torch.uint8), None
    mem = _memory(r)
    if mem.closed:
        raise RuntimeError("commsim hosting: CUDA tensor allocated after this rank's exit")

    def get() -> int:
        return _allocator(r, mem, device).malloc(nbytes)
    try:
        ptr = _with_device(r, device, get)
    except CudaError as e:
        total = r.cluster.gpu(r.driver.proc.gpus[device]).memory_bytes
        raise torch.OutOfMemoryError(
            f"CUDA out of memory. Tried to allocate {_human(nbytes)}. GPU {device} has a total "
            f"capacity of {_human(total)} ({e})") from None
    alloc = mem.allocators[device]
    view: np.ndarray = r.driver.view(ptr, nbytes)
    block = DeviceBlock(ptr, nbytes, device, int(view.ctypes.data), device_clock(r, device))
    # The block returns to its allocator when the storage lets go of this view (the last
    # tensor over it is gone), as PyTorch's storage deleter frees its block.
    weakref.finalize(view, _free, mem, alloc, ptr)
    return torch.from_numpy(view), block


def raw_alloc(r: HostedRank, device: int, nbytes: int) -> int:
    """torch.cuda.caching_allocator_alloc: a block no tensor owns, freed by raw_delete."""
    mem = _memory(r)
    if mem.closed:
        raise RuntimeError("commsim hosting: caching_allocator_alloc after this rank's exit")
    ptr = _with_device(r, device, lambda: _allocator(r, mem, device).malloc(nbytes))
    mem.raw[ptr] = device
    return ptr


def raw_delete(r: HostedRank, ptr: int) -> None:
    """torch.cuda.caching_allocator_delete; a pointer it did not hand out is refused as
    CUDACachingAllocator's raw_delete refuses it ("invalid device pointer: <ptr>")."""
    mem = _memory(r)
    device = mem.raw.pop(ptr, None)
    if device is None:
        raise RuntimeError(f"invalid device pointer: {ptr:#x}")
    if not mem.closed:
        mem.allocators[device].free(ptr)


def device_clock(r: HostedRank, device: int) -> list[int]:
    """The rank's op counter of `device` (one list, shared by that device's blocks)."""
    return _memory(r).clocks.setdefault(device, [0])


def allocator_of(r: HostedRank, device: int) -> CachingAllocator:
    """The rank's caching allocator of `device` (made on first use)."""
    mem = _memory(r)
    return _with_device(r, device, lambda: _allocator(r, mem, device))


def _free(mem: RankMemory, alloc: CachingAllocator, ptr: int) -> None:
    if mem.closed:
        return
    alloc.free(ptr)


def close(r: HostedRank) -> None:
    """The rank's exit: every cached segment back to the driver."""
    mem = _memory(r)
    if mem.closed:
        return
    mem.closed = True
    for device, a in mem.allocators.items():
        try:
            _with_device(r, device, a.close)
        except Exception:
            # A context left unusable (a sticky error) refuses cudaFree: the process's exit
            # frees what is left all the same (SimFabric.exit_process), listed as residue.
            pass


# ---- torch.cuda.empty_cache (the statistics: torch/cuda_memory.py) -------------------------

def empty_cache(r: HostedRank) -> None:
    mem = _memory(r)
    if mem.closed:
        return
    for device, a in mem.allocators.items():
        _with_device(r, device, a.empty_cache)


def _human(n: int) -> str:
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            return f"{n / size:.2f} {unit}"
    return f"{n} bytes"
