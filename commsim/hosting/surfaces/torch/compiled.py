"""torch._C's compiled CUDA and NCCL calls of a CUDA build of torch, in a hosted rank.

A CUDA build of torch on a machine without a driver (a vLLM developer's laptop, a CI image)
has the compiled `torch._C._cuda_*` / `torch._C._nccl_*` functions the CPU build lacks; they
call the real libcudart and the bundled NCCL. Called from a hosted rank (vLLM's
`cuda_device_count_stateless` falls back to `torch._C._cuda_getDeviceCount()`; torch.cuda's
own Python reaches `_cuda_memoryStats`, `_nccl_version` ...), they would answer for the
machine running commsim, not the simulated one: 0 devices, "Found no NVIDIA driver on your
system", the wheel's own NCCL version. Installed, each call below is answered per rank:
- SERVED: from the same hosted functions torch.cuda's surface answers with (cuda.py,
  device.py, cuda_memory.py), and the run's NCCL version, which the served libnccl.so.2
  answers too (nccl/comm.py `run_version`), packed as torch's binding packs it (major << 32 | minor << 16 | patch:
  torch/cuda/nccl.py `version()` unpacks it so, torch 2.14.0);
- NOT_SIMULATED: every other call that reaches the device, its streams, its allocator or
  NCCL fails naming itself (torch.cuda.nccl's single-process multi-GPU collectives included).
The CPU build has none of these names and is left as it is (a hosted rank's
`torch.cuda._is_compiled()` stays the build's own answer: docs/hosting.md, "CPU and CUDA
builds of torch"). Outside a hosted rank every name is torch's own.
"""

from __future__ import annotations

from typing import Any, Callable

from commsim.hosting.install.dispatch import not_simulated, per_rank
from commsim.hosting.install.patches import Patches
from commsim.hosting.install.registry import register_surface
from commsim.hosting.state.session import current, hosted
from commsim.hosting.surfaces.nccl.comm import run_version
from commsim.hosting.surfaces.torch import cuda_memory
from commsim.hosting.surfaces.torch import graphs as torch_graphs
from commsim.hosting.surfaces.torch.cuda import can_device_access_peer
from commsim.hosting.surfaces.torch.device import (current_device, device_count, empty_cache,
                                                   set_device, synchronize)


def nccl_version_packed(version: int) -> int:
    """NCCL_VERSION(major, minor, patch) = major*10000 + minor*100 + patch (nccl.h) as
    torch._C._nccl_version() gives it: major << 32 | minor << 16 | patch."""
    major, minor, patch = version // 10000, version // 100 % 100, version % 100
    return major << 32 | minor << 16 | patch


def _nccl_version() -> int:
    """The run's NCCL, as the served libnccl.so.2's ncclGetVersion answers it."""
    return nccl_version_packed(run_version(current()))


SERVED: dict[str, Callable[..., Any]] = {
    "_cuda_getDeviceCount": device_count,
    "_cuda_getDevice": current_device,
    "_cuda_setDevice": set_device,
    "_cuda_synchronize": synchronize,
    "_cuda_canDeviceAccessPeer": can_device_access_peer,
    "_cuda_emptyCache": empty_cache,
    "_cuda_isCurrentStreamCapturing": torch_graphs.is_current_stream_capturing,
    "_cuda_memoryStats": cuda_memory.HOSTED["memory_stats_as_nested_dict"],
    "_nccl_version": _nccl_version,
    "_nccl_version_suffix": lambda: b"",
}

# Calls that reach the driver, the runtime's streams, the caching allocator or NCCL (torch
# 2.14.0's torch._C). Getters and setters of host-side settings (tunableop, cuDNN benchmark
# limits, the sync-debug mode) are left as the build's own.
NOT_SIMULATED = (
    "_cuda_init", "_cuda_exchangeDevice", "_cuda_maybeExchangeDevice", "_cuda_hasPrimaryContext",
    "_cuda_getCurrentStream", "_cuda_getDefaultStream", "_cuda_setStream",
    "_cuda_getCurrentRawStream", "_cuda_getStreamFromExternal",
    "_cuda_getCurrentBlasHandle", "_cuda_getCurrentSolverHandle", "_cuda_sleep",
    "_cuda_cudaCachingAllocator_raw_alloc", "_cuda_cudaCachingAllocator_raw_delete",
    "_cuda_memorySnapshot", "_cuda_resetPeakMemoryStats", "_cuda_resetAccumulatedMemoryStats",
    "_cuda_setMemoryFraction", "_cuda_getMemoryFraction", "_cuda_ipc_collect",
    "_cuda_beginAllocateToPool", "_cuda_endAllocateToPool", "_cuda_releasePool",
    "_cuda_hostMemoryStats", "_cuda_record_memory_history",
    "_nccl_all_reduce", "_nccl_reduce", "_nccl_broadcast", "_nccl_all_gather",
    "_nccl_reduce_scatter", "_nccl_init_rank", "_nccl_unique_id",
)


def nccl_version() -> tuple[int, int, int]:
    """torch.cuda.nccl.version() in a hosted rank: the run's NCCL, on either build. The CPU
    build has no NCCL to ask, but a hosted rank's torch is a CUDA build's (torch.version.cuda,
    cuda.py), and torch's own code asks it: c10d_logger.py, logging a failed collective of an
    "nccl" group (torch 2.13.0)."""
    v = run_version(current())
    return v // 10000, v // 100 % 100, v % 100


def _install(patches: Patches) -> None:
    patches.on_import("torch.cuda", lambda _: _patch(patches))
    patches.on_import("torch.cuda.nccl", lambda m: patches.attr(
        m, "version", per_rank("version", nccl_version, m.version, hosted)))


def _patch(patches: Patches) -> None:
    import torch
    c = torch._C
    if not hasattr(c, "_cuda_getDeviceCount"):
        return                              # the CPU build: none of these exist
    for name, fn in SERVED.items():
        if hasattr(c, name):
            patches.attr(c, name, per_rank(name, fn, getattr(c, name), hosted))
    for name in NOT_SIMULATED:
        if hasattr(c, name):
            patches.attr(c, name, per_rank(name, not_simulated(f"torch._C.{name}"),
                                           getattr(c, name), hosted))


SURFACE = register_surface("torch._C (CUDA build)", _install)
install, uninstall = SURFACE.install, SURFACE.uninstall
