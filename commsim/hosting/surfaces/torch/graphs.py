"""CUDA graphs of a hosted rank: `torch.cuda.CUDAGraph`, `torch.cuda.graph`,
`torch.cuda.graph_pool_handle`, `torch.cuda.is_current_stream_capturing`.

Capture goes through the rank's SimDriver, as torch's CUDAGraph does on a GPU
(ATen/cuda/CUDAGraph.cpp): `capture_begin` routes the device's allocations to the graph's
private pool, then calls `cudaStreamBeginCapture(stream, mode)` with `capture_error_mode`
("global" by default); `capture_end` calls `cudaStreamEndCapture`. While the capture runs,
the driver's rules CG1-CG4 apply (commsim/sim/stream_capture.py): a `cudaMalloc` or a legacy
IPC call (CG3, UNCONFIRMED) the program makes itself (cuda-python, libcudart through ctypes) is refused with
cudaErrorStreamCaptureUnsupported and invalidates the capture, and the graph's exit raises
torch's `AcceleratorError("CUDA error: operation failed due to a previous error during
capture")` (cudaErrorStreamCaptureInvalidated), as on a real GPU. The caching allocator's own
growth of the graph pool is RELAXED (PyTorch's cudaMallocMaybeCapturing), so it never
invalidates a capture (libmodels/caching_allocator.py, rule AL5).

What the graph holds. On a GPU captured kernels do not run at capture; they run at each
`replay()`. Here the aten ops dispatched on the capturing device's CUDA tensors, on the
capture stream, are recorded in order:
- an op that writes a tensor (in place, `out=`, `copy_`, `x[i] = v`) is recorded and *not*
  run: the tensor is unchanged until the graph is replayed;
- an op that makes a new tensor runs at once (its result is placed in the graph's pool, so
  its shape is known) and is recorded: replay recomputes it into the same memory;
- views run at once and record nothing (no device work).
`replay()` re-runs the recorded ops in order over the same device memory, and with them the
libnccl operations the body issued on the capture stream (nccl.py records them through
`capture_on` instead of running them, as NCCL's kernels are captured on a GPU); it does not
re-run torch.distributed collectives, cuda-python / libcudart calls or anything else the
body did outside torch's ops (those ran once, at capture). Host reads and host copies inside a capture
(`.cpu()`, `.item()`, `print`, a CPU tensor operand, `torch.tensor(..., device="cuda")`)
synchronise with the device, which a real capture refuses (cudaErrorStreamCaptureUnsupported);
commsim does not model that refusal: they fail naming themselves (NotImplementedError).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from cuda.bindings import runtime as cudart

from commsim.hosting.state.cuda_state import rank_state
from commsim.hosting.state.session import current, hosted
from commsim.hosting.surfaces.torch import memory as torch_memory
from commsim.hosting.surfaces.torch.device import check_cuda, current_device, empty_cache, synchronize
from commsim.hosting.surfaces.torch.streams import (HostedStream, HostedStreamContext, current_stream,
                                                    current_streams)

CAPTURING = [0]       # captures underway in this process: the tensor dispatch's fast check


def leaves(x: Any, out: list) -> list:
    """The items of nested tuples, lists and dicts, in order, appended to `out`."""
    if isinstance(x, (tuple, list)):
        for v in x:
            leaves(v, out)
    elif isinstance(x, dict):
        for v in x.values():
            leaves(v, out)
    else:
        out.append(x)
    return out

_MODE = cudart.cudaStreamCaptureMode
_MODES = {"global": _MODE.cudaStreamCaptureModeGlobal,
          "thread_local": _MODE.cudaStreamCaptureModeThreadLocal,
          "relaxed": _MODE.cudaStreamCaptureModeRelaxed}
# Ops that alias their input without being marked as views in their schema.
_VIEWLIKE = frozenset({"_unsafe_view", "_reshape_alias", "lift_fresh"})


@dataclass(eq=False)
class _PoolUse:
    """A graph-private pool of one device and how many graphs hold it (torch releases a
    pool when its last graph is reset: CUDAGraph::reset -> releasePool)."""

    device: int
    pool: Any
    users: int = 0


@dataclass(eq=False)
class Capture:
    """The capture underway on a rank."""

    graph: "HostedCUDAGraph"
    device: int
    stream: int
    routing: Any                                  # the allocator's pool routing (a context)
    work: list[Callable[[], Any]]

    def on_stream(self) -> bool:
        return current_streams().get(self.device, 0) == self.stream

    def record_write(self, func: Any, args: tuple, kwargs: dict, inner_args: tuple,
                     inner_kwargs: dict) -> Any:
        """Record an op that writes its operands; give back what it would return."""
        result = _written(func, args, kwargs)
        self.work.append(lambda: func(*inner_args, **inner_kwargs))
        return result

    def record_result(self, func: Any, inner_args: tuple, inner_kwargs: dict, outs: list) -> None:
        """Record an op that made new tensors `outs` (already placed): replay recomputes them."""
        if not outs:
            return

        def run() -> None:
            again = [t for t in leaves(func(*inner_args, **inner_kwargs), [])
                     if hasattr(t, "copy_")]
            for dst, src in zip(outs, again):
                dst._inner.copy_(src)
        self.work.append(run)


@dataclass
class GraphState:
    """Per rank: the capture underway, the graph pools, torch.cuda.graph's side streams."""

    capture: Capture | None = None
    pools: dict[tuple[int, int], _PoolUse] = field(default_factory=dict)
    next_graph: int = 1
    next_handle: int = 1
    side_streams: dict[int, Any] = field(default_factory=dict)


def _state(r: Any) -> GraphState:
    return rank_state(r, "torch.graphs", GraphState)


def capture_for(devices: Any) -> Capture | None:
    """The rank's capture underway on one of `devices` and its capture stream, if any."""
    r = hosted()
    if r is None:
        return None
    c = _state(r).capture
    if c is None or c.device not in devices or not c.on_stream():
        return None
    return c


def capture_on(device: int, stream: int) -> Capture | None:
    """The rank's capture underway on `device` with `stream` as its capture stream: work a
    library enqueues on that stream (libnccl's collectives) belongs to the graph and is
    recorded into it (`Capture.work`) instead of running."""
    if not CAPTURING[0]:
        return None
    r = hosted()
    if r is None:
        return None
    c = _state(r).capture
    if c is None or c.device != device or c.stream != stream:
        return None
    return c


def is_viewlike(func: Any, name: str) -> bool:
    return bool(getattr(func, "is_view", False)) or name in _VIEWLIKE


def host_sync(what: str) -> None:
    raise NotImplementedError(
        f"commsim hosting: {what} inside a CUDA graph capture synchronises with the device, "
        f"which a real capture refuses (cudaErrorStreamCaptureUnsupported); not simulated")


def check_no_host_copy(device: int, what: str) -> None:
    """Refuse a host-to-device copy onto a capturing device (factories with host data)."""
    if CAPTURING[0] and capture_for((device,)) is not None:
        host_sync(what)


def check_outside_capture(t: Any, what: str) -> None:
    """A collective on a CUDA tensor of a capturing device: on a GPU it would be captured and
    re-run by every replay, which this model cannot do (it records aten ops only)."""
    if CAPTURING[0] and getattr(t, "is_cuda", False) and capture_for((t.device.index,)) is not None:
        raise NotImplementedError(f"commsim hosting: {what} on a CUDA tensor inside a CUDA graph "
                                  f"capture is not simulated (a replay re-runs only the aten ops "
                                  f"recorded during the capture)")


def _written(func: Any, args: tuple, kwargs: dict) -> Any:
    """What a writing op returns: the arguments its schema says it writes (self for an
    in-place op, `out` for an out= op), without running it."""
    schema = func._schema
    bound = dict(kwargs)
    positional = [a for a in schema.arguments if not a.kwarg_only]
    for a, v in zip(positional, args):
        bound[a.name] = v
    outs = []
    for ret in schema.returns:
        ai = ret.alias_info
        arg = None if ai is None or not ai.is_write else next(
            (a for a in schema.arguments if a.alias_info is not None
             and a.alias_info.before_set == ai.before_set), None)
        if arg is None or arg.name not in bound:
            raise NotImplementedError(f"commsim hosting: {func} inside a CUDA graph capture is "
                                      f"not simulated (it writes a tensor and returns a new one)")
        outs.append(bound[arg.name])
    if not outs:
        return None
    return outs[0] if len(outs) == 1 else tuple(outs)


# ---- torch.cuda.CUDAGraph ------------------------------------------------------------------

class HostedCUDAGraph:
    """torch.cuda.CUDAGraph of a hosted rank (module docstring)."""

    def __init__(self, keep_graph: bool = False):
        self.keep_graph = bool(keep_graph)
        self._rank: Any = None
        self._device = -1
        self._pool_id: tuple[int, int] | None = None
        self._work: list[Callable[[], Any]] = []
        self._ended = False                      # torch's capture_ended_

    def capture_begin(self, pool: Any = None, capture_error_mode: str = "global",
                      check_input_liveness: bool = False) -> None:
        if self._ended:
            raise RuntimeError("This CUDAGraph instance already owns a captured graph. To "
                               "capture a new graph, create a new instance.")
        mode = _MODES.get(capture_error_mode)
        if mode is None:
            raise RuntimeError(f"Unknown capture error mode. Expected `global`, `thread_local`, "
                               f"or `relaxed`, got {capture_error_mode}")
        r = current()
        st = _state(r)
        stream = current_stream()
        if stream.cuda_stream == 0:
            raise RuntimeError("CUDA graphs must be captured on a non-default stream. (However, "
                               "after capture, it's ok to replay them on the default stream.)")
        device = stream.device_index
        if pool is not None and any(pool):
            pool_id = (int(pool[0]), int(pool[1]))
        else:
            pool_id = (st.next_graph, 0)         # a graph's own pool: first value set
            st.next_graph += 1
        alloc = torch_memory.allocator_of(r, device)
        use = st.pools.get(pool_id)
        if use is None:
            use = st.pools[pool_id] = _PoolUse(device, alloc.new_graph_pool())
        use.users += 1
        # CUDAGraph::capture_begin: the allocator routes to the pool before the capture begins.
        routing = alloc.capture(use.pool)
        routing.__enter__()
        res = r.driver.cudaStreamBeginCapture(stream.cuda_stream, mode)
        if int(res[0]) != 0:
            routing.__exit__(None, None, None)
            _release(r, st, pool_id)
            check_cuda(res)
        self._rank, self._device, self._pool_id = r, device, pool_id
        self._work = []
        st.capture = Capture(self, device, stream.cuda_stream, routing, self._work)
        CAPTURING[0] += 1

    def capture_end(self) -> None:
        r = current()
        st = _state(r)
        c = st.capture
        if c is None or c.graph is not self or current_stream(c.device).cuda_stream != c.stream \
                or current_device() != c.device:
            raise RuntimeError("Capture must end on the same stream it began on.")
        st.capture = None
        CAPTURING[0] -= 1
        c.routing.__exit__(None, None, None)
        res = r.driver.cudaStreamEndCapture(c.stream)
        if int(res[0]) != 0:
            # No graph: what was recorded is dropped and the pool's use with it (torch leaves
            # the pool held until the process ends; commsim frees it for a clean residue).
            self._work = []
            _release(r, st, self._pool_id)
            check_cuda(res)
        self._ended = True

    def instantiate(self) -> None:
        if not self._ended:
            raise RuntimeError("capture_end() must have been called before calling instantiate")
        if not self.keep_graph:
            raise RuntimeError("instantiate() is intended to be called by the user only when "
                               "keep_graph=true")

    def replay(self) -> None:
        """Re-run the recorded ops in order (module docstring); each advances the op clock."""
        if not self._ended:
            raise RuntimeError("Called CUDAGraph::replay without a preceding successful capture.")
        clock = torch_memory.device_clock(current(), self._device)
        for op in self._work:
            op()
            clock[0] += 1

    def reset(self) -> None:
        if self._ended:
            self._ended = False
            self._work = []
            _release(self._rank, _state(self._rank), self._pool_id)

    def pool(self) -> tuple[int, int]:
        if not self._ended:
            raise RuntimeError("Called CUDAGraph::pool() without a preceding successful capture.")
        return self._pool_id                      # type: ignore[return-value]

    def __del__(self) -> None:
        try:
            self.reset()
        except Exception:
            pass                                  # torch warns, never raises, at destruction

    def _unsimulated(self, name: str) -> None:
        raise NotImplementedError(f"commsim hosting: torch.cuda.CUDAGraph.{name} is not simulated")

    def raw_cuda_graph(self) -> int:
        self._unsimulated("raw_cuda_graph")
        return 0

    def raw_cuda_graph_exec(self) -> int:
        self._unsimulated("raw_cuda_graph_exec")
        return 0

    def debug_dump(self, debug_path: str) -> None:
        self._unsimulated("debug_dump")

    def enable_debug_mode(self) -> None:
        self._unsimulated("enable_debug_mode")


def _release(r: Any, st: GraphState, pool_id: Any) -> None:
    use = st.pools.get(pool_id)
    if use is None:
        return
    use.users -= 1
    if use.users <= 0:
        del st.pools[pool_id]
        mem = torch_memory._memory(r)
        if not mem.closed:
            torch_memory._with_device(r, use.device, lambda: torch_memory.allocator_of(
                r, use.device).release_graph_pool(use.pool))


# ---- torch.cuda.graph ----------------------------------------------------------------------

class HostedGraphContext:
    """`with torch.cuda.graph(g, pool=None, stream=None, capture_error_mode="global"):`"""

    def __init__(self, cuda_graph: HostedCUDAGraph, pool: Any = None, stream: Any = None,
                 capture_error_mode: str = "global", enable_annotations: bool = False,
                 check_input_liveness: bool = False):
        if enable_annotations:
            raise NotImplementedError("commsim hosting: torch.cuda.graph(enable_annotations=True)"
                                      " is not simulated")
        if stream is None:
            # torch keeps one side stream for every capture (graph.default_capture_stream).
            sides = _state(current()).side_streams
            d = current_device()
            if d not in sides:
                sides[d] = HostedStream(d)
            stream = sides[d]
        self.pool = () if pool is None else (pool,)
        self.capture_stream = stream
        self.stream_ctx = HostedStreamContext(stream)
        self.cuda_graph = cuda_graph
        self.capture_error_mode = capture_error_mode

    def __enter__(self) -> None:
        synchronize()
        empty_cache()                   # torch frees what it can for the graph first
        self.stream_ctx.__enter__()
        try:
            self.cuda_graph.capture_begin(*self.pool, capture_error_mode=self.capture_error_mode)
        except BaseException:
            self.stream_ctx.__exit__(None, None, None)
            raise

    def __exit__(self, *exc: Any) -> None:
        try:
            self.cuda_graph.capture_end()
        finally:
            self.stream_ctx.__exit__(*exc)


def graph_pool_handle() -> tuple[int, int]:
    """An id for a pool several graphs share (second value set, as torch's)."""
    st = _state(current())
    handle = (0, st.next_handle)
    st.next_handle += 1
    return handle


def is_current_stream_capturing() -> bool:
    c = _state(current()).capture
    if c is None:
        return False
    device = int(check_cuda(current().driver.cudaGetDevice()))
    return device == c.device and c.on_stream()
