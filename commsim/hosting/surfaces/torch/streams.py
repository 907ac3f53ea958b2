"""Streams and events of a hosted rank's torch.cuda: `Stream` (with `.cuda_stream`, the
cudaStream_t value), `ExternalStream`, the current stream per device (`current_stream`,
`set_stream`, `stream` / `StreamContext`, `default_stream`) and `Event`.

Work completes at launch in the simulator (HostedStream), so an event is complete
as soon as it is recorded: `query()` is True, `synchronize()` and `wait()` return at once.
Like torch's, the event is created lazily, on the device of the stream that first records
it (`record(stream=None)` uses `torch.cuda.current_stream()`), and only streams of that
device may record it again.

The clock. A recorded event stamps the rank's *op clock* of its device: the number of aten
ops dispatched on that device's CUDA tensors so far (views included; a graph replay counts
the ops it re-runs), one microsecond per op. `elapsed_time(end)` is the difference in
milliseconds, so it measures how much tensor work the program launched between the two
records, deterministically (a function of the program, not of the host's speed). What a
real GPU would report depends on each kernel's duration: **UNCONFIRMED**, no source gives
a per-op cost; do not read the figure as a performance prediction. Collectives and raw
driver calls (cuda-python, libcudart) do not advance the clock.

`ipc_handle()` / `from_ipc_handle()` (cudaIpcGetEventHandle) are not simulated and fail
naming themselves.
"""

from __future__ import annotations

from typing import Any

from commsim.hosting.state.cuda_state import rank_state
from commsim.hosting.state.session import current
from commsim.hosting.surfaces.cuda import runtime_api as api
from commsim.hosting.surfaces.torch import memory as torch_memory
from commsim.hosting.surfaces.torch.device import check_cuda, device_index_of, lazy_init, on_device

TICK_MS = 1e-3            # one op = 1 us on the clock (UNCONFIRMED, see the docstring)


class HostedStream:
    """torch.cuda.Stream of a hosted rank: a name for a cudaStream_t (work completes at
    launch in the simulator, so synchronize and query are immediate)."""

    def __init__(self, device: Any = None, priority: int = 0, *, stream_ptr: int | None = None,
                 **kwargs: Any):
        lazy_init()
        self.device_index = device_index_of(device)
        if stream_ptr is None:
            with on_device(self.device_index):
                stream_ptr = int(check_cuda(api.cudaStreamCreate()))
        self.cuda_stream = int(stream_ptr)
        self.priority = priority

    @property
    def device(self) -> Any:
        import torch
        return torch.device("cuda", self.device_index)

    def synchronize(self) -> None:
        check_cuda(api.cudaStreamSynchronize(self.cuda_stream))

    def query(self) -> bool:
        return True

    def wait_stream(self, stream: "HostedStream") -> None:
        pass

    def record_event(self, event: Any = None) -> Any:
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


def external_stream(stream_ptr: int, device: Any = None) -> HostedStream:
    """torch.cuda.ExternalStream: a Stream naming a cudaStream_t made elsewhere (by the
    rank's cudart or cuda-python); torch takes it as given, without checking it."""
    return HostedStream(device, stream_ptr=int(stream_ptr))


def current_streams() -> dict[int, int]:
    """device -> the cudaStream_t torch.cuda.current_stream(device) names, for the rank."""
    return rank_state(current(), "torch.cuda", dict).setdefault("streams", {})


def current_stream(device: Any = None) -> HostedStream:
    # torch's current stream starts as the default (legacy NULL) stream: cuda_stream 0.
    lazy_init()
    d = device_index_of(device)
    return HostedStream(d, stream_ptr=current_streams().get(d, 0))


def set_stream(stream: Any) -> None:
    """The stream's device gets it as its current stream (the current device stays)."""
    if stream is None:
        return
    lazy_init()
    current_streams()[stream.device_index] = stream.cuda_stream


def _set_stream(stream: Any) -> None:
    # torch.cuda.StreamContext switches through the module attribute `torch.cuda.set_stream`
    # (torch/cuda/__init__.py of the installed torch), so a library that wraps it sees every
    # switch (vLLM's vllm/utils/torch_utils.py keeps its current stream that way).
    import torch
    torch.cuda.set_stream(stream)


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
        _set_stream(self.stream)

    def __exit__(self, *exc: Any) -> bool:
        for s in reversed(self.prev):
            _set_stream(s)
        self.prev = []
        return False


def stream(stream: Any) -> HostedStreamContext:
    return HostedStreamContext(stream)


def default_stream(device: Any = None) -> HostedStream:
    return HostedStream(device, stream_ptr=0)


class HostedEvent:
    """torch.cuda.Event for a hosted rank (module docstring)."""

    def __init__(self, enable_timing: bool = False, blocking: bool = False,
                 interprocess: bool = False, external: bool = False):
        self.enable_timing = bool(enable_timing)
        self.blocking = bool(blocking)
        self.interprocess = bool(interprocess)
        self.external = bool(external)
        self.device_index: int | None = None      # set when first recorded (torch: lazy)
        self._stamp: int | None = None
        self._handle = 0

    @classmethod
    def from_ipc_handle(cls, device: Any, handle: Any) -> "HostedEvent":
        _no_ipc("from_ipc_handle")
        raise AssertionError("unreachable")

    @property
    def device(self) -> Any:
        import torch
        return None if self.device_index is None else torch.device("cuda", self.device_index)

    @property
    def cuda_event(self) -> int:
        """The cudaEvent_t value: 0 until the event is first recorded, as in torch."""
        return self._handle

    def record(self, stream: Any = None) -> None:
        if stream is None:
            stream = current_stream()
        d = stream.device_index
        if self.device_index is not None and d != self.device_index:
            # ATen/cuda/CUDAEvent.h (record): the event stays on the device it was made on.
            raise RuntimeError(f"Event device {self.device_index} does not match recording "
                               f"stream's device {d}.")
        r = current()
        if self.device_index is None:
            self.device_index = d
            self._handle = _new_handle(r)
        self._stamp = torch_memory.device_clock(r, d)[0]

    def wait(self, stream: Any = None) -> None:
        """cudaStreamWaitEvent: the recorded work is already complete, nothing to wait for."""
        return None

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        return None

    def elapsed_time(self, end_event: "HostedEvent") -> float:
        """Milliseconds on the op clock between this record and `end_event`'s."""
        # ATen/cuda/CUDAEvent.h (elapsed_time): timing flags first, then both recorded
        # (TORCH_CHECK_VALUE: a ValueError).
        if not (self.enable_timing and getattr(end_event, "enable_timing", False)):
            raise ValueError("Both events must be created with argument 'enable_timing=True'.")
        if self._stamp is None or getattr(end_event, "_stamp", None) is None:
            raise ValueError("Both events must be recorded before calculating elapsed time.")
        return float((end_event._stamp - self._stamp) * TICK_MS)

    def ipc_handle(self) -> Any:
        _no_ipc("ipc_handle")

    def __repr__(self) -> str:
        if self._handle:
            return f"<torch.cuda.Event {self._handle:#x}>"
        return "<torch.cuda.Event uninitialized>"


def _no_ipc(name: str) -> None:
    raise NotImplementedError(f"commsim hosting: torch.cuda.Event.{name} (a CUDA event shared "
                              f"between processes) is not simulated")


def _new_handle(r: Any) -> int:
    """A distinct, nonzero cudaEvent_t value per rank (an opaque handle, never dereferenced)."""
    st = rank_state(r, "torch.events", lambda: [0])
    st[0] += 1
    return 0xE0000000 + st[0]
