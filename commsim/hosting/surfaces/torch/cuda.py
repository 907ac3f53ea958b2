"""`torch.cuda`'s control plane on the CPU build of torch, for a hosted rank.

The CPU build has no CUDA: `torch.cuda.is_available()` is False and most calls assert
"Torch not compiled with CUDA enabled". Installed, this surface answers the control-plane
calls from the rank's runtime (surfaces/cuda/runtime_api.py), so they agree with cuda-python,
libcudart and NVML: the device calls (`is_available`, `device_count`, `current_device`,
`set_device`, `device`, `device_of`, `synchronize`, `mem_get_info`, `is_initialized`, `init`:
device.py), the device's properties (`get_device_capability`, `get_device_name`,
`get_device_properties`, `can_device_access_peer`, `get_arch_list`: here), streams and events
(`current_stream` / `default_stream` / `Stream` / `ExternalStream`, `stream` /
`StreamContext` / `set_stream`, `Event`: streams.py), CUDA graphs (`CUDAGraph`, `graph`,
`graph_pool_handle`, `is_current_stream_capturing`: graphs.py), the CUDA generators
(random.py), and torch's own `is_bf16_supported` / `is_tf32_supported` (PASSTHROUGH) too.
Outside a hosted rank every name is torch's own.

The memory API (`memory_stats`, `memory_allocated`, `memory_summary`,
`set_per_process_memory_fraction` ...: cuda_memory.py) and `empty_cache` answer from the
rank's caching allocator of CUDA tensors (memory.py; the tensors themselves: tensors.py,
factories.py).
"""

from __future__ import annotations

import inspect
import types
from dataclasses import dataclass
from typing import Any

from commsim.hosting.install.dispatch import not_simulated, per_rank, per_rank_class
from commsim.hosting.install.patches import Patches
from commsim.hosting.state import host_layout
from commsim.hosting.state.device_props import DeviceProps, device_props
from commsim.hosting.install.registry import register_surface
from commsim.hosting.state.session import current, hosted
from commsim.hosting.surfaces.cuda import runtime_api as api
from commsim.hosting.surfaces.torch import cuda_memory
from commsim.hosting.surfaces.torch import graphs as torch_graphs
from commsim.hosting.surfaces.torch import random as torch_random
from commsim.hosting.surfaces.torch.device import (HostedDevice, HostedDeviceOf, check_cuda, current_device,
                                                   device_count, device_index_of, empty_cache, init,
                                                   is_available, is_initialized, lazy_init, mem_get_info,
                                                   set_device, synchronize)
from commsim.hosting.surfaces.torch.streams import (HostedEvent, HostedStream, HostedStreamContext,
                                                    current_stream, default_stream, external_stream,
                                                    set_stream, stream)


class _CUuuid:
    """`torch._C._CUuuid`, the type of `get_device_properties(i).uuid` (the CPU build of
    torch has none): `.bytes` is the 16 bytes as a list of ints, `str()` the 8-4-4-4-12 hex
    form without NVML's `GPU-` prefix, no equality beyond identity (torch/csrc/cuda/Module.cpp,
    registerCudaDeviceProperties, pytorch/pytorch at 87a08c18). Code that names a device
    to NVML writes `f"GPU-{props.uuid}"`."""

    __slots__ = ("_raw",)

    def __init__(self, raw: bytes) -> None:
        self._raw = bytes(raw)

    @property
    def bytes(self) -> list[int]:
        return list(self._raw)

    def __str__(self) -> str:
        h = self._raw.hex()
        return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"

    def __repr__(self) -> str:
        return f"<torch._C._CUuuid object at {id(self):#x}>"


_CUuuid.__module__ = "torch._C"


@dataclass(frozen=True)
class HostedDeviceProperties:
    """What torch.cuda.get_device_properties gives (torch._C._CudaDeviceProperties fields),
    each read from the rank's DeviceProps (commsim/hosting/state/device_props.py)."""

    name: str
    major: int
    minor: int
    total_memory: int
    multi_processor_count: int
    uuid: _CUuuid
    pci_bus_id: int
    pci_device_id: int
    pci_domain_id: int
    is_integrated: int
    is_multi_gpu_board: int
    max_threads_per_multi_processor: int
    max_threads_per_block: int
    warp_size: int
    L2_cache_size: int
    clock_rate: int                     # kHz, as cudaDevAttrClockRate
    memory_clock_rate: int              # kHz
    memory_bus_width: int
    shared_memory_per_block: int
    shared_memory_per_block_optin: int
    shared_memory_per_multiprocessor: int
    regs_per_multiprocessor: int
    gcnArchName: str                    # ROCm's field; a CUDA build fills it with the name (UNCONFIRMED)

    @classmethod
    def of(cls, p: DeviceProps) -> "HostedDeviceProperties":
        return cls(
            name=p.name, major=p.major, minor=p.minor, total_memory=p.total_memory,
            multi_processor_count=p.multi_processor_count,
            uuid=_CUuuid(host_layout.uuid_bytes(p.uuid)), pci_bus_id=p.pci.bus,
            pci_device_id=p.pci.device, pci_domain_id=p.pci.domain, is_integrated=p.integrated,
            is_multi_gpu_board=0, max_threads_per_multi_processor=p.max_threads_per_multi_processor,
            max_threads_per_block=p.max_threads_per_block, warp_size=p.warp_size,
            L2_cache_size=p.l2_cache_size, clock_rate=p.clock_rate_khz,
            memory_clock_rate=p.memory_clock_rate_khz, memory_bus_width=p.memory_bus_width,
            shared_memory_per_block=p.shared_memory_per_block,
            shared_memory_per_block_optin=p.shared_memory_per_block_optin,
            shared_memory_per_multiprocessor=p.shared_memory_per_multiprocessor,
            regs_per_multiprocessor=p.regs_per_multiprocessor, gcnArchName=p.name)

    def __repr__(self) -> str:
        return (f"_CudaDeviceProperties(name='{self.name}', major={self.major}, minor={self.minor}, "
                f"total_memory={self.total_memory // (1 << 20)}MB, multi_processor_count="
                f"{self.multi_processor_count}, uuid={self.uuid}, "
                f"pci_bus_id={self.pci_bus_id}, pci_device_id={self.pci_device_id}, "
                f"pci_domain_id={self.pci_domain_id})")


# ---- the hosted functions -----------------------------------------------------------------

def get_device_properties(device: Any = None) -> HostedDeviceProperties:
    lazy_init()
    d = device_index_of(device)
    if not 0 <= d < device_count():
        raise AssertionError("Invalid device id")         # torch.cuda.get_device_properties
    r = current()
    return HostedDeviceProperties.of(device_props(r.cluster, r.driver.proc.gpus[d]))


def get_device_capability(device: Any = None) -> tuple[int, int]:
    p = get_device_properties(device)
    return p.major, p.minor


def get_device_name(device: Any = None) -> str:
    return get_device_properties(device).name


def can_device_access_peer(device: Any, peer_device: Any) -> bool:
    lazy_init()
    d, p = device_index_of(device), device_index_of(peer_device, optional=False)
    n = device_count()
    if not 0 <= d < n:
        raise AssertionError("Invalid device id")         # torch.cuda.can_device_access_peer
    if not 0 <= p < n:
        raise AssertionError("Invalid peer device id")
    return bool(check_cuda(api.cudaDeviceCanAccessPeer(d, p)))


# What torch.cuda.get_arch_list() gives (the SASS/PTX targets the build was compiled for),
# for a CUDA 13 build of torch 2.13. UNCONFIRMED: taken as the CUDA 13.0 wheels' target list
# (7.5 through 12.0 plus 12.0 PTX); the CPU build itself reports [].
ARCH_LIST = ("sm_75", "sm_80", "sm_86", "sm_90", "sm_100", "sm_110", "sm_120", "compute_120")


def get_arch_list() -> list[str]:
    return list(ARCH_LIST) if is_available() else []


# torch.version.cuda in a hosted rank: what a CUDA 13.0 build of torch reports, matching the
# runtime served (cudaRuntimeGetVersion 13000, libcudart.so.13) and the arch list above.
# Programs read it to pick a library: vLLM's find_nccl_library loads libnccl.so.2 when it is
# set, librccl when torch.version.hip is, and raises otherwise. The CPU build says None, and
# so does every thread that is not a hosted rank.
CUDA_VERSION = "13.0"


class _HostedVersion(types.ModuleType):
    """torch.version with a per-rank `cuda` (a module's class may be swapped for a subclass
    of ModuleType; the property wins over the module's own attribute)."""

    @property
    def cuda(self) -> Any:
        return CUDA_VERSION if hosted() is not None else self.__dict__.get("cuda")

    @cuda.setter
    def cuda(self, value: Any) -> None:
        self.__dict__["cuda"] = value


def _stats() -> dict[str, Any]:
    return {**cuda_memory.HOSTED, "empty_cache": empty_cache}


_HOSTED: dict[str, Any] = {
    "is_available": is_available, "device_count": device_count, "current_device": current_device,
    "set_device": set_device, "get_device_properties": get_device_properties,
    "get_device_capability": get_device_capability, "get_device_name": get_device_name,
    "can_device_access_peer": can_device_access_peer, "synchronize": synchronize,
    "mem_get_info": mem_get_info, "is_initialized": is_initialized, "init": init,
    "current_stream": current_stream, "default_stream": default_stream,
    "set_stream": set_stream, "stream": stream, "get_arch_list": get_arch_list, **_stats(),
}
# torch.cuda functions that are Python over calls this surface answers: torch's own code runs
# in a hosted rank (is_bf16_supported: is_available, current_device, get_device_properties'
# major >= 8, else a bfloat16 tensor's creation; is_tf32_supported: is_bf16_supported
# without emulation).
PASSTHROUGH = ("is_bf16_supported", "is_tf32_supported")
SIMULATED = tuple(sorted(_HOSTED) + list(PASSTHROUGH) + [
                                     "Stream", "device", "device_of", "ExternalStream",
                                     "StreamContext", "Event", "CUDAGraph",
                                     "graph", "graph_pool_handle", "is_current_stream_capturing",
                                     "manual_seed", "manual_seed_all", "seed", "seed_all",
                                     "initial_seed", "get_rng_state", "set_rng_state",
                                     "get_rng_state_all", "set_rng_state_all"])
# torch.cuda classes a hosted program may construct that commsim does not simulate.
_UNSIMULATED_CLASSES = ("MemPool", "GreenContext", "CUDAPluggableAllocator")


def _public_functions(tc: Any) -> list[str]:
    return [n for n in dir(tc) if not n.startswith("_") and inspect.isfunction(getattr(tc, n))
            and getattr(getattr(tc, n), "__module__", "").startswith("torch.cuda")]


def _install(patches: Patches) -> None:
    """Patch torch.cuda when the program imports it (at once if it already has): a hosted
    process that never loads torch does not pay for importing it."""
    patches.on_import("torch.cuda", lambda module: _patch(patches, module))
    patches.on_import("torch.cuda.memory", lambda module: _patch_memory_module(patches, module))
    patches.on_import("torch.version", lambda module: _patch_version(patches, module))


def _patch_version(patches: Patches, module: Any) -> None:
    if type(module) is types.ModuleType:
        patches.attr(module, "__class__", _HostedVersion)


def _patch_memory_module(patches: Patches, module: Any) -> None:
    """torch.cuda.memory's own Python functions (memory_summary, memory_allocated ...) call
    its module-level memory_stats / memory_stats_as_nested_dict: route those too, so torch's
    formatter runs over the hosted statistics."""
    for name in ("memory_stats", "memory_stats_as_nested_dict"):
        patches.attr(module, name, per_rank(name, cuda_memory.HOSTED[name], getattr(module, name),
                                            hosted))


def _patch(patches: Patches, tc: Any) -> None:
    # tc is torch.cuda itself (not yet an attribute of the torch package)
    def serve(name: str, fn: Any) -> None:
        patches.attr(tc, name, per_rank(name, fn, getattr(tc, name), hosted))

    def serve_class(name: str, cls: Any) -> None:
        patches.attr(tc, name, per_rank_class(name, cls, getattr(tc, name), hosted))

    for name, fn in _HOSTED.items():
        serve(name, fn)
    # torch's C++ calls torch.cuda._lazy_init before it makes a CUDA tensor (a factory
    # reached without the tensor surface's mode: another thread of a procs-mode rank).
    serve("_lazy_init", lazy_init)
    for name, fn in (("graph_pool_handle", torch_graphs.graph_pool_handle),
                     ("is_current_stream_capturing", torch_graphs.is_current_stream_capturing),
                     *torch_random.HOSTED.items()):
        serve(name, fn)
    for name, cls in (("Stream", HostedStream), ("device", HostedDevice),
                      ("device_of", HostedDeviceOf), ("ExternalStream", external_stream),
                      ("StreamContext", HostedStreamContext), ("Event", HostedEvent),
                      ("CUDAGraph", torch_graphs.HostedCUDAGraph),
                      ("graph", torch_graphs.HostedGraphContext)):
        serve_class(name, cls)
    # Everything else public fails loudly in a hosted rank, naming itself.
    for name in _public_functions(tc):
        if not patches.holds(tc, name) and name not in PASSTHROUGH:
            serve(name, not_simulated(f"torch.cuda.{name}"))
    for name in _UNSIMULATED_CLASSES:
        if hasattr(tc, name):
            serve_class(name, not_simulated(f"torch.cuda.{name}"))


SURFACE = register_surface("torch.cuda", _install)
install, uninstall = SURFACE.install, SURFACE.uninstall
