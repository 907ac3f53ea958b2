"""The CUDA device a hosted rank's torch works on: device selection and checks, torch's lazy
initialisation, synchronisation and memory info, answered from the rank's runtime
(surfaces/cuda/runtime_api.py) so torch agrees with cuda-python, libcudart and NVML. The
torch.cuda surface (cuda.py), its streams, graphs, random generators, tensors and
torch.accelerator are built on it. A CUDA error raises `torch.AcceleratorError("CUDA error:
<text>")` as torch's C10_CUDA_CHECK does (torch 2.13: AcceleratorError, a RuntimeError).
torch is imported inside the functions that need it: they run only in a program that has
loaded it, and this module is imported when surfaces install, before the program runs."""

from __future__ import annotations

import contextlib
from typing import Any, Iterator

from commsim.driver import error_string
from commsim.hosting.surfaces.cuda import runtime_api as api
from commsim.hosting.state.cuda_state import rank_state, runtime_entry
from commsim.hosting.state.session import current
from commsim.hosting.surfaces.torch import memory as torch_memory


CHECK_TAIL = ("\nCUDA kernel errors might be asynchronously reported at some other API call, "
               "so the stacktrace below might be incorrect.\nFor debugging consider passing "
               "CUDA_LAUNCH_BLOCKING=1")


def check_cuda(res: tuple) -> Any:
    import torch                 # loaded: only a program that loaded torch calls here
    if int(res[0]) != 0:
        raise torch.AcceleratorError(f"CUDA error: {error_string(res[0])}{CHECK_TAIL}")
    return res[1] if len(res) == 2 else res[1:]


def device_index_of(device: Any, optional: bool = True) -> int:
    """torch.cuda._utils._get_device_index for the hosted rank."""
    import torch
    if isinstance(device, str):
        device = torch.device(device)
    if isinstance(device, torch.device):
        if device.type != "cuda":
            raise ValueError(f"Expected a cuda device, but got: {device}")
        device = device.index
    if device is None:
        if not optional:
            raise ValueError("Expected a torch.device with a specified index or an integer, but got:None")
        return int(check_cuda(api.cudaGetDevice()))
    if isinstance(device, int):
        return device
    raise ValueError(f"Expected a torch.device with a specified index or an integer, but got:{device}")


@contextlib.contextmanager
def on_device(device: Any) -> Iterator[int]:
    d = device_index_of(device)
    prev = int(check_cuda(api.cudaGetDevice()))
    if d != prev and d >= 0:
        check_cuda(api.cudaSetDevice(d))
    try:
        yield d
    finally:
        if d != prev and d >= 0:
            check_cuda(api.cudaSetDevice(prev))


class HostedDevice:
    """`with torch.cuda.device(d):` for a hosted rank."""

    def __init__(self, device: Any):
        self.idx = device_index_of(device)
        self.prev_idx = -1

    def __enter__(self) -> None:
        self.prev_idx = int(check_cuda(api.cudaGetDevice()))
        if self.idx >= 0 and self.idx != self.prev_idx:
            check_cuda(api.cudaSetDevice(self.idx))

    def __exit__(self, *exc: Any) -> bool:
        if self.idx >= 0 and self.idx != self.prev_idx:
            check_cuda(api.cudaSetDevice(self.prev_idx))
        return False


class HostedDeviceOf(HostedDevice):
    """`with torch.cuda.device_of(t):` the device of a CUDA tensor (or storage), no change
    for a CPU one (torch.cuda.device_of: index `obj.get_device()` if `obj.is_cuda`, else -1)."""

    def __init__(self, obj: Any):
        super().__init__(obj.get_device() if obj.is_cuda else -1)


def is_available() -> bool:
    return int(api.cudaGetDeviceCount()[1] or 0) > 0


def device_count() -> int:
    return int(check_cuda(api.cudaGetDeviceCount()))


def current_device() -> int:
    lazy_init()
    return int(check_cuda(api.cudaGetDevice()))


def set_device(device: Any) -> None:
    lazy_init()
    d = device_index_of(device)
    if d >= 0:
        check_cuda(api.cudaSetDevice(d))


def synchronize(device: Any = None) -> None:
    lazy_init()
    with on_device(device):
        check_cuda(api.cudaDeviceSynchronize())


def mem_get_info(device: Any = None) -> tuple[int, int]:
    lazy_init()
    with on_device(device):
        free, total = check_cuda(api.cudaMemGetInfo())
    return int(free), int(total)


def lazy_init() -> None:
    """torch.cuda._lazy_init for the rank: torch's own "initialised" flag, set by the calls
    that run lazy_init in torch/cuda/__init__.py (not by is_available / device_count)."""
    r = current()
    runtime_entry(r)
    rank_state(r, "torch.cuda", dict)["initialized"] = True


def is_initialized() -> bool:
    return rank_state(current(), "torch.cuda", dict).get("initialized", False)


def init() -> None:
    lazy_init()


def empty_cache() -> None:
    torch_memory.empty_cache(current())


def is_ordinal(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def cuda_index(dev: Any) -> int | None:
    """The device index a `device=` argument names when it is a CUDA device, else None."""
    import torch
    if is_ordinal(dev):
        d = torch.device("cuda", dev)
    elif isinstance(dev, (str, torch.device)):
        d = torch.device(dev)
    else:
        return None
    if d.type != "cuda":
        return None
    lazy_init()
    index = current_device() if d.index is None else d.index
    if not 0 <= index < device_count():
        raise torch.AcceleratorError("CUDA error: invalid device ordinal" + CHECK_TAIL)
    return index
