"""`torch.cuda`'s memory API in a hosted rank, answered by the rank's caching allocators.

Serving stacks size their KV cache from these (vLLM's profiling run reads
`memory_stats()["allocated_bytes.all.peak"]`, `memory_reserved()`, `mem_get_info()`), cap a
process with `set_per_process_memory_fraction`, and print `memory_summary()` on an OOM. Each
device of the rank has one allocator (torch/memory.py) keeping PyTorch's statistics
(commsim/libmodels/allocator_stats.py), so the figures are what the simulated allocator did:

- `memory_stats` / `memory_stats_as_nested_dict`: torch's keys and shape. Not reported:
  `reserved_bytes_by_private_pools` (graph pools are not keyed by MemPool ids here).
- `memory_allocated`, `max_memory_allocated`, `memory_reserved`, `max_memory_reserved`
  (and the deprecated `memory_cached` / `max_memory_cached`), `reset_peak_memory_stats`,
  `reset_max_memory_allocated` / `_cached`, `reset_accumulated_memory_stats`.
- `memory_summary`: torch's own formatter over these statistics.
- `memory_snapshot`: the segments and blocks (no stack frames: nothing records history).
- `set_per_process_memory_fraction` / `get_per_process_memory_fraction`: argument checks as
  torch's; the allocator then refuses to reserve past fraction x total (rule AL7).
- `caching_allocator_alloc` / `caching_allocator_delete`: raw blocks of the allocator.
- `get_allocator_backend`: "native" (PYTORCH_CUDA_ALLOC_CONF is not read).
- `ipc_collect`: nothing to collect. torch keeps a block another process imported in a
  limbo until its reference counter drops; here a producer's block returns to its allocator
  when its tensor is collected (torch/ipc.py sends no reference counter), so no limbo exists.
"""

from __future__ import annotations

import collections
from typing import Any, Callable

from commsim.hosting.state.session import HostedRank, current
from commsim.hosting.surfaces.torch import memory as torch_memory
from commsim.hosting.surfaces.torch.device import device_index_of, lazy_init
from commsim.hosting.surfaces.torch.streams import HostedStream


def _rank_device(device: Any) -> tuple[HostedRank, int]:
    lazy_init()
    return current(), device_index_of(device)


def _stats(device: Any) -> Any:
    r, d = _rank_device(device)
    return torch_memory.allocator_of(r, d).stats


def memory_stats_as_nested_dict(device: Any = None) -> dict[str, Any]:
    return _stats(device).nested()


def _flat(device: Any) -> dict[str, Any]:
    """memory_stats: the nested dict flattened with '.', keys sorted (torch/cuda/memory.py)."""
    out: list[tuple[str, Any]] = []

    def walk(prefix: str, obj: Any) -> None:
        if isinstance(obj, dict):
            for k, v in obj.items():
                walk(f"{prefix}.{k}" if prefix else str(k), v)
        else:
            out.append((prefix, obj))
    walk("", memory_stats_as_nested_dict(device))
    return collections.OrderedDict(sorted(out))


def memory_stats(device: Any = None) -> dict[str, Any]:
    return _flat(device)


def _current(name: str, field: str = "current") -> Callable[..., int]:
    def call(device: Any = None) -> int:
        return int(_stats(device).nested()[name]["all"][field])
    call.__name__ = name
    return call


memory_allocated = _current("allocated_bytes")
max_memory_allocated = _current("allocated_bytes", "peak")
memory_reserved = _current("reserved_bytes")
max_memory_reserved = _current("reserved_bytes", "peak")


def reset_peak_memory_stats(device: Any = None) -> None:
    _stats(device).reset_peak()


def reset_accumulated_memory_stats(device: Any = None) -> None:
    _stats(device).reset_accumulated()


def memory_summary(device: Any = None, abbreviated: bool = False) -> str:
    """torch's own table (torch.cuda.memory.memory_summary is Python over memory_stats, which
    this surface routes to the allocator), for an explicit device index."""
    r, d = _rank_device(device)
    import torch.cuda.memory as real      # torch's own (loaded: torch.cuda called us)
    return real.memory_summary(device=d, abbreviated=abbreviated)


def memory_snapshot(mempool_id: Any = None, include_traces: bool = True) -> list[dict[str, Any]]:
    """Every segment of the rank's allocators, as torch.cuda.memory._snapshot's "segments"."""
    r = current()
    mem = torch_memory._memory(r)
    out = []
    for device, alloc in sorted(mem.allocators.items()):
        for seg in sorted(alloc.segments, key=lambda s: s.base):
            blocks = [{"address": b.ptr, "size": b.size, "requested_size": b.requested,
                       "state": "active_allocated" if b.allocated else "inactive", "frames": []}
                      for b in seg.blocks]
            used = [b for b in seg.blocks if b.allocated]
            out.append({"device": device, "address": seg.base, "total_size": seg.size,
                        "allocated_size": sum(b.size for b in used),
                        "active_size": sum(b.size for b in used),
                        "requested_size": sum(b.requested for b in used),
                        "stream": 0, "segment_type": "small" if seg.small else "large",
                        "segment_pool_id": (0, seg.pool.pool_id if seg.pool else 0),
                        "is_expandable": seg.expandable, "frames": [], "blocks": blocks})
    return out


def _total(r: HostedRank, device: int) -> int:
    return int(r.cluster.gpu(r.driver.proc.gpus[device]).memory_bytes)


def set_per_process_memory_fraction(fraction: Any, device: Any = None) -> None:
    r, d = _rank_device(device)
    # torch/cuda/memory.py's checks, same order and words.
    if not isinstance(fraction, float):
        raise TypeError("Invalid type for fraction argument, must be `float`")
    if fraction < 0 or fraction > 1:
        raise ValueError(f"Invalid fraction value: {fraction}. Allowed range: 0~1")
    alloc = torch_memory.allocator_of(r, d)
    alloc.limit = int(fraction * _total(r, d))
    alloc.fraction = fraction       # type: ignore[attr-defined]


def get_per_process_memory_fraction(device: Any = None) -> float:
    r, d = _rank_device(device)
    return float(getattr(torch_memory.allocator_of(r, d), "fraction", 1.0))


def caching_allocator_alloc(size: int, device: Any = None, stream: Any = None) -> int:
    r, d = _rank_device(device)
    if stream is not None and not isinstance(stream, (int, HostedStream)):
        raise TypeError("Invalid type for stream argument, must be `torch.cuda.Stream` or `int` "
                        "representing a pointer to an existing stream")
    return torch_memory.raw_alloc(r, d, int(size))


def caching_allocator_delete(mem_ptr: int) -> None:
    torch_memory.raw_delete(current(), int(mem_ptr))


def get_allocator_backend() -> str:
    return "native"


def ipc_collect() -> None:
    _rank_device(None)


HOSTED: dict[str, Callable[..., Any]] = {
    "memory_stats": memory_stats, "memory_stats_as_nested_dict": memory_stats_as_nested_dict,
    "memory_allocated": memory_allocated, "max_memory_allocated": max_memory_allocated,
    "memory_reserved": memory_reserved, "max_memory_reserved": max_memory_reserved,
    "memory_cached": memory_reserved, "max_memory_cached": max_memory_reserved,
    "reset_peak_memory_stats": reset_peak_memory_stats,
    "reset_max_memory_allocated": reset_peak_memory_stats,
    "reset_max_memory_cached": reset_peak_memory_stats,
    "reset_accumulated_memory_stats": reset_accumulated_memory_stats,
    "memory_summary": memory_summary, "memory_snapshot": memory_snapshot,
    "set_per_process_memory_fraction": set_per_process_memory_fraction,
    "get_per_process_memory_fraction": get_per_process_memory_fraction,
    "caching_allocator_alloc": caching_allocator_alloc,
    "caching_allocator_delete": caching_allocator_delete,
    "get_allocator_backend": get_allocator_backend, "ipc_collect": ipc_collect,
}
