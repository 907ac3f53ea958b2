"""`torch.accelerator` in a hosted rank: the device-generic API answers as on a CUDA host.

On the CPU build `torch.accelerator.current_accelerator()` is None and `device_count()` 0,
so code that picks its device through this API (PyTorch's own device-generic code does, and
newer serving code) would take its CPU path in a hosted rank. Installed, the API answers
from the same places as torch.cuda (cuda.py, cuda_memory.py): the accelerator is
`device(type='cuda')`, the device index, streams and synchronisation are the rank's, and
torch.accelerator.memory's statistics are the caching allocator's. `empty_host_cache` has
nothing to release (pinned host memory is not simulated, so its cache is always empty);
`get_device_capability` and `Graph` fail naming themselves. Outside a hosted rank every
name is torch's own.
"""

from __future__ import annotations

from typing import Any, Callable

from commsim.hosting.install.dispatch import not_simulated, per_rank, per_rank_class
from commsim.hosting.install.patches import Patches
from commsim.hosting.install.registry import register_surface
from commsim.hosting.state.session import hosted
from commsim.hosting.surfaces.torch import cuda as tc
from commsim.hosting.surfaces.torch import cuda_memory
from commsim.hosting.surfaces.torch.device import HostedDevice, is_available


def current_accelerator(check_available: bool = False) -> Any:
    import torch
    if check_available and not is_available():
        return None
    return torch.device("cuda")


def _cuda(name: str) -> Callable[..., Any]:
    def call(*args: Any, **kwargs: Any) -> Any:
        return getattr(tc, name)(*args, **kwargs)
    call.__name__ = name
    return call


def _memory(name: str) -> Callable[..., Any]:
    def call(*args: Any, **kwargs: Any) -> Any:
        return getattr(cuda_memory, name)(*args, **kwargs)
    call.__name__ = name
    return call


def empty_host_cache() -> None:
    return None


class HostedDeviceIndex:
    """`with torch.accelerator.device_index(i):` (None: no change)."""

    def __init__(self, device: int | None, /) -> None:
        self._ctx = HostedDevice(device) if device is not None else None

    def __enter__(self) -> None:
        if self._ctx is not None:
            self._ctx.__enter__()

    def __exit__(self, *exc: Any) -> bool:
        if self._ctx is not None:
            self._ctx.__exit__(*exc)
        return False


MEMORY: dict[str, Callable[..., Any]] = {
    "empty_cache": _cuda("empty_cache"), "empty_host_cache": empty_host_cache,
    "get_memory_info": _cuda("mem_get_info"),
    **{n: _memory(n) for n in ("memory_stats", "memory_allocated", "max_memory_allocated",
                               "memory_reserved", "max_memory_reserved",
                               "reset_accumulated_memory_stats", "reset_peak_memory_stats")},
}
HOSTED: dict[str, Callable[..., Any]] = {
    "current_accelerator": current_accelerator,
    "device_count": _cuda("device_count"), "is_available": _cuda("is_available"),
    "current_device_index": _cuda("current_device"), "current_device_idx": _cuda("current_device"),
    "set_device_index": _cuda("set_device"), "set_device_idx": _cuda("set_device"),
    "current_stream": _cuda("current_stream"), "set_stream": _cuda("set_stream"),
    "synchronize": _cuda("synchronize"),
    "get_device_capability": not_simulated("torch.accelerator.get_device_capability"),
    **MEMORY,
}
CLASSES = {"device_index": HostedDeviceIndex,
           "Graph": not_simulated("torch.accelerator.Graph")}

def _patch(patches: Patches, module: Any, table: dict[str, Callable[..., Any]],
           classes: dict[str, Any]) -> None:
    for name, fn in table.items():
        real = getattr(module, name, None)
        if real is not None:
            patches.attr(module, name, per_rank(name, fn, real, hosted))
    for name, cls in classes.items():
        real = getattr(module, name, None)
        if real is not None:
            patches.attr(module, name, per_rank_class(name, cls, real, hosted))


def _install(patches: Patches) -> None:
    patches.on_import("torch.accelerator", lambda m: _patch(patches, m, HOSTED, CLASSES))
    patches.on_import("torch.accelerator.memory", lambda m: _patch(patches, m, MEMORY, {}))


SURFACE = register_surface("torch.accelerator", _install)
install, uninstall = SURFACE.install, SURFACE.uninstall
