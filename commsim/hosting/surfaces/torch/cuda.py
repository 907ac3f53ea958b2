"""`torch.cuda`'s control plane on the CPU build of torch, for a hosted rank.

The CPU build has no CUDA: `torch.cuda.is_available()` is False and most calls assert
"Torch not compiled with CUDA enabled". Installed, this surface answers the control-plane
calls from the rank's runtime (cuda_runtime_api.py), so they agree with cuda-python,
libcudart and NVML: `is_available`, `device_count`, `current_device`, `set_device`,
`device` (context manager), `get_device_capability`, `get_device_name`,
`get_device_properties`, `can_device_access_peer`, `synchronize`, `mem_get_info`,
`is_initialized`, `init`, `current_stream` / `default_stream` / `Stream` (with
`.cuda_stream`, the cudaStream_t value), `stream` / `StreamContext` / `set_stream` (the
current stream per device, per rank). `Event` is torch_events.py's; `CUDAGraph`, `graph`,
`graph_pool_handle` and `is_current_stream_capturing` are torch_graphs.py's; `device_of`,
`ExternalStream` (a Stream over a given cudaStream_t), `get_arch_list`, and torch's own
`is_bf16_supported` / `is_tf32_supported` (PASSTHROUGH) too. Outside a hosted rank every name
is torch's own.

The memory API (`memory_stats`, `memory_allocated`, `memory_summary`,
`set_per_process_memory_fraction` ...: torch_cuda_memory.py) and `empty_cache` answer from
the rank's caching allocator of CUDA tensors (torch_memory.py;
the tensors themselves: torch_tensors.py, torch_factories.py). A CUDA error raises `torch.AcceleratorError("CUDA error: <text>")` as torch's
C10_CUDA_CHECK does (torch 2.13: AcceleratorError, a RuntimeError).
"""

from __future__ import annotations

import contextlib
import functools
import sys
import types
from dataclasses import dataclass
from typing import Any, Callable, Iterator

from commsim.hosting.install.registry import when_imported

torch: Any = None          # bound when the program imports torch.cuda (see _install)
from commsim.driver import error_string
from commsim.hosting.surfaces.cuda import runtime_api as api
from commsim.hosting.state import host_layout
from commsim.hosting.state.device_props import DeviceProps, device_props
from commsim.hosting.state.cuda_state import maybe_rank, not_simulated, rank_state, runtime_entry
from commsim.hosting.state.session import current, hosted
from commsim.hosting.install.nesting import nested
from commsim.hosting.install.registry import register_surface

_CHECK_TAIL = ("\nCUDA kernel errors might be asynchronously reported at some other API call, "
               "so the stacktrace below might be incorrect.\nFor debugging consider passing "
               "CUDA_LAUNCH_BLOCKING=1")


def _check(res: tuple) -> Any:
    if int(res[0]) != 0:
        raise torch.AcceleratorError(f"CUDA error: {error_string(res[0])}{_CHECK_TAIL}")
    return res[1] if len(res) == 2 else res[1:]


def _index(device: Any, optional: bool = True) -> int:
    """torch.cuda._utils._get_device_index for the hosted rank."""
    if isinstance(device, str):
        device = torch.device(device)
    if isinstance(device, torch.device):
        if device.type != "cuda":
            raise ValueError(f"Expected a cuda device, but got: {device}")
        device = device.index
    if device is None:
        if not optional:
            raise ValueError("Expected a torch.device with a specified index or an integer, but got:None")
        return int(_check(api.cudaGetDevice()))
    if isinstance(device, int):
        return device
    raise ValueError(f"Expected a torch.device with a specified index or an integer, but got:{device}")


@contextlib.contextmanager
def _on(device: Any) -> Iterator[int]:
    d = _index(device)
    prev = int(_check(api.cudaGetDevice()))
    if d != prev and d >= 0:
        _check(api.cudaSetDevice(d))
    try:
        yield d
    finally:
        if d != prev and d >= 0:
            _check(api.cudaSetDevice(prev))


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


class HostedStream:
    """torch.cuda.Stream of a hosted rank: a name for a cudaStream_t (work completes at
    launch in the simulator, so synchronize and query are immediate)."""

    def __init__(self, device: Any = None, priority: int = 0, *, stream_ptr: int | None = None,
                 **kwargs: Any):
        _lazy_init()
        self.device_index = _index(device)
        if stream_ptr is None:
            with _on(self.device_index):
                stream_ptr = int(_check(api.cudaStreamCreate()))
        self.cuda_stream = int(stream_ptr)
        self.priority = priority

    @property
    def device(self) -> torch.device:
        return torch.device("cuda", self.device_index)

    def synchronize(self) -> None:
        _check(api.cudaStreamSynchronize(self.cuda_stream))

    def query(self) -> bool:
        return True

    def wait_stream(self, stream: "HostedStream") -> None:
        pass

    def record_event(self, event: Any = None) -> Any:
        from commsim.hosting.surfaces.torch.events import HostedEvent
        event = event if event is not None else HostedEvent()
        event.record(self)
        return event

    def wait_event(self, event: Any) -> None:
        event.wait(self)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, HostedStream) and (self.cuda_stream, self.device_index) == \
            (other.cuda_stream, other.device_index)

    def __hash__(self) -> int:
        return hash((self.cuda_stream, self.device_index))

    def __repr__(self) -> str:
        return f"<torch.cuda.Stream device=cuda:{self.device_index} cuda_stream={self.cuda_stream:#x}>"


class HostedDevice:
    """`with torch.cuda.device(d):` for a hosted rank."""

    def __init__(self, device: Any):
        self.idx = _index(device)
        self.prev_idx = -1

    def __enter__(self) -> None:
        self.prev_idx = int(_check(api.cudaGetDevice()))
        if self.idx >= 0 and self.idx != self.prev_idx:
            _check(api.cudaSetDevice(self.idx))

    def __exit__(self, *exc: Any) -> bool:
        if self.idx >= 0 and self.idx != self.prev_idx:
            _check(api.cudaSetDevice(self.prev_idx))
        return False


class HostedDeviceOf(HostedDevice):
    """`with torch.cuda.device_of(t):` the device of a CUDA tensor (or storage), no change
    for a CPU one (torch.cuda.device_of: index `obj.get_device()` if `obj.is_cuda`, else -1)."""

    def __init__(self, obj: Any):
        super().__init__(obj.get_device() if obj.is_cuda else -1)


def external_stream(stream_ptr: int, device: Any = None) -> HostedStream:
    """torch.cuda.ExternalStream: a Stream naming a cudaStream_t made elsewhere (by the
    rank's cudart or cuda-python); torch takes it as given, without checking it."""
    return HostedStream(device, stream_ptr=int(stream_ptr))


# ---- the hosted functions -----------------------------------------------------------------

def is_available() -> bool:
    return int(api.cudaGetDeviceCount()[1] or 0) > 0


def device_count() -> int:
    return int(_check(api.cudaGetDeviceCount()))


def current_device() -> int:
    _lazy_init()
    return int(_check(api.cudaGetDevice()))


def set_device(device: Any) -> None:
    _lazy_init()
    d = _index(device)
    if d >= 0:
        _check(api.cudaSetDevice(d))


def get_device_properties(device: Any = None) -> HostedDeviceProperties:
    _lazy_init()
    d = _index(device)
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
    _lazy_init()
    d, p = _index(device), _index(peer_device, optional=False)
    n = device_count()
    if not 0 <= d < n:
        raise AssertionError("Invalid device id")         # torch.cuda.can_device_access_peer
    if not 0 <= p < n:
        raise AssertionError("Invalid peer device id")
    return bool(_check(api.cudaDeviceCanAccessPeer(d, p)))


def synchronize(device: Any = None) -> None:
    _lazy_init()
    with _on(device):
        _check(api.cudaDeviceSynchronize())


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


def _patch_version(module: Any) -> None:
    if _active[0] and type(module) is types.ModuleType:
        module.__class__ = _HostedVersion


def _unpatch_version() -> None:
    module = sys.modules.get("torch.version")
    if module is not None and type(module) is _HostedVersion:
        module.__class__ = types.ModuleType


def mem_get_info(device: Any = None) -> tuple[int, int]:
    _lazy_init()
    with _on(device):
        free, total = _check(api.cudaMemGetInfo())
    return int(free), int(total)


def _lazy_init() -> None:
    """torch.cuda._lazy_init for the rank: torch's own "initialised" flag, set by the calls
    that run _lazy_init in torch/cuda/__init__.py (not by is_available / device_count)."""
    r = current()
    runtime_entry(r)
    rank_state(r, "torch.cuda", dict)["initialized"] = True


def is_initialized() -> bool:
    return rank_state(current(), "torch.cuda", dict).get("initialized", False)


def init() -> None:
    _lazy_init()


def _current_streams() -> dict[int, int]:
    """device -> the cudaStream_t torch.cuda.current_stream(device) names, for the rank."""
    return rank_state(current(), "torch.cuda", dict).setdefault("streams", {})


def current_stream(device: Any = None) -> HostedStream:
    # torch's current stream starts as the default (legacy NULL) stream: cuda_stream 0.
    _lazy_init()
    d = _index(device)
    return HostedStream(d, stream_ptr=_current_streams().get(d, 0))


def set_stream(stream: Any) -> None:
    """The stream's device gets it as its current stream (the current device stays)."""
    if stream is None:
        return
    _lazy_init()
    _current_streams()[stream.device_index] = stream.cuda_stream


class HostedStreamContext:
    """`with torch.cuda.stream(s):` for a hosted rank: `s` is its device's current stream
    inside (torch.cuda.StreamContext's semantics: the current device does not change)."""

    def __init__(self, stream: Any):
        self.stream = stream
        self.prev: list[HostedStream] = []

    def __enter__(self) -> None:
        if self.stream is None:
            return
        self.prev = [current_stream(None)]
        if self.stream.device_index != self.prev[0].device_index:
            self.prev.append(current_stream(self.stream.device_index))
        set_stream(self.stream)

    def __exit__(self, *exc: Any) -> bool:
        for s in reversed(self.prev):
            set_stream(s)
        self.prev = []
        return False


def stream(stream: Any) -> HostedStreamContext:
    return HostedStreamContext(stream)


def default_stream(device: Any = None) -> HostedStream:
    return HostedStream(device, stream_ptr=0)


def empty_cache() -> None:
    from commsim.hosting.surfaces.torch import memory as torch_memory
    torch_memory.empty_cache(current())


def _stats() -> dict[str, Any]:
    from commsim.hosting.surfaces.torch import cuda_memory as torch_cuda_memory
    return {**torch_cuda_memory.HOSTED, "empty_cache": empty_cache}


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
_saved: dict[str, Any] = {}


def _dispatch(name: str, hosted: Callable[..., Any], real: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(real)
    def call(*args: Any, **kwargs: Any) -> Any:
        if maybe_rank() is None:
            return real(*args, **kwargs)
        return hosted(*args, **kwargs)
    return call


class _ClassDispatch(type):
    """A class whose construction gives the hosted object in a hosted rank, torch's own
    object elsewhere (`torch.cuda.Stream(...)`, `torch.cuda.device(...)`)."""

    def __call__(cls, *args: Any, **kwargs: Any) -> Any:
        impl = cls._hosted if maybe_rank() is not None else cls._real
        return impl(*args, **kwargs)

    def __instancecheck__(cls, obj: Any) -> bool:
        kinds = tuple(k for k in (cls._hosted, cls._real) if isinstance(k, type))
        return isinstance(obj, kinds)


# torch.cuda classes a hosted program may construct that commsim does not simulate.
_UNSIMULATED_CLASSES = ("MemPool", "GreenContext", "CUDAPluggableAllocator")


_tc: list[Any] = [None]      # the torch.cuda module once patched


def _public_functions() -> list[str]:
    import inspect
    return [n for n in dir(_tc[0]) if not n.startswith("_")
            and inspect.isfunction(getattr(_tc[0], n))
            and getattr(getattr(_tc[0], n), "__module__", "").startswith("torch.cuda")]


_active = [False]


def _install() -> None:
    """Patch _tc[0] when the program imports it (at once if it already has): a hosted
    process that never loads torch does not pay for importing it."""
    _active[0] = True
    when_imported("torch.cuda", _patch)
    when_imported("torch.cuda.memory", _patch_memory_module)
    when_imported("torch.version", _patch_version)


_saved_memory_module: dict[str, Any] = {}
_mm: list[Any] = [None]      # torch.cuda.memory once patched


def _patch_memory_module(module: Any) -> None:
    """torch.cuda.memory's own Python functions (memory_summary, memory_allocated ...) call
    its module-level memory_stats / memory_stats_as_nested_dict: route those too, so torch's
    formatter runs over the hosted statistics."""
    if not _active[0] or _saved_memory_module:
        return
    from commsim.hosting.surfaces.torch import cuda_memory as tcm
    _mm[0] = module
    for name in ("memory_stats", "memory_stats_as_nested_dict"):
        _saved_memory_module[name] = getattr(module, name)
        setattr(module, name, _dispatch(name, tcm.HOSTED[name], _saved_memory_module[name]))


def _patch(module: Any) -> None:
    global torch
    if not _active[0] or _saved:
        return
    import torch as _torch
    torch = _torch          # may be partially initialised here: used only at call time
    _tc[0] = module         # torch.cuda itself (not yet an attribute of the torch package)
    for name, fn in _HOSTED.items():
        _saved[name] = getattr(_tc[0], name)
        setattr(_tc[0], name, _dispatch(name, fn, _saved[name]))
    # torch's C++ calls torch.cuda._lazy_init before it makes a CUDA tensor (a factory
    # reached without the tensor surface's mode: another thread of a procs-mode rank).
    _saved["_lazy_init"] = _tc[0]._lazy_init
    _tc[0]._lazy_init = _dispatch("_lazy_init", _lazy_init, _saved["_lazy_init"])
    from commsim.hosting.surfaces.torch.events import HostedEvent
    from commsim.hosting.surfaces.torch import graphs as tg
    from commsim.hosting.surfaces.torch import random as torch_random
    for name, fn in (("graph_pool_handle", tg.graph_pool_handle),
                     ("is_current_stream_capturing", tg.is_current_stream_capturing),
                     *torch_random.HOSTED.items()):
        _saved[name] = getattr(_tc[0], name)
        setattr(_tc[0], name, _dispatch(name, fn, _saved[name]))
    for name, hosted in (("Stream", HostedStream), ("device", HostedDevice),
                         ("device_of", HostedDeviceOf), ("ExternalStream", external_stream),
                         ("StreamContext", HostedStreamContext), ("Event", HostedEvent),
                         ("CUDAGraph", tg.HostedCUDAGraph), ("graph", tg.HostedGraphContext)):
        _saved[name] = getattr(_tc[0], name)
        setattr(_tc[0], name, _ClassDispatch(name, (), {"_hosted": hosted, "_real": _saved[name]}))
    # Everything else public fails loudly in a hosted rank, naming itself.
    for name in _public_functions():
        if name in _saved or name in PASSTHROUGH:
            continue
        _saved[name] = getattr(_tc[0], name)
        setattr(_tc[0], name, _dispatch(name, not_simulated("torch.cuda", name), _saved[name]))
    for name in _UNSIMULATED_CLASSES:
        if hasattr(_tc[0], name):
            _saved[name] = getattr(_tc[0], name)
            setattr(_tc[0], name, _ClassDispatch(
                name, (), {"_hosted": not_simulated("torch.cuda", name), "_real": _saved[name]}))


def _uninstall() -> None:
    _active[0] = False
    for name, value in _saved.items():
        setattr(_tc[0], name, value)
    _saved.clear()
    for name, value in _saved_memory_module.items():
        setattr(_mm[0], name, value)
    _saved_memory_module.clear()
    _unpatch_version()


install, uninstall = nested(_install, _uninstall)
register_surface("torch.cuda", install, uninstall)
