"""The caching allocator's statistics, in PyTorch's shape (`torch.cuda.memory_stats`).

PyTorch keeps, per device, a `Stat` (current, peak, allocated = historical increase, freed =
historical decrease) for each core statistic and pool, plus event counters
(c10/core/CachingDeviceAllocator.h: `Stat`, `DeviceStats`; the keys
`torch._C._cuda_memoryStats` returns are listed in torch/cuda/memory.py's `memory_stats`
docstring). commsim's CachingAllocator updates one DeviceStats as it hands out, frees,
grows and releases, so a hosted program's `torch.cuda.memory_stats()`,
`max_memory_reserved()` or `memory_summary()` read what the simulated allocator did.

The pools: "small_pool" holds requests of at most 1 MiB (kSmallSize), "large_pool" the rest;
"all" is its own Stat (its peak is the peak of the sum, not a sum of peaks).
"""

from __future__ import annotations

from typing import Any

POOLS = ("all", "small_pool", "large_pool")
# torch's core statistics. "active"/"active_bytes" equal "allocation"/"allocated_bytes" here:
# a block is active past its free while another stream's recorded work is pending, and in the
# simulator work completes when it is launched, so a free takes effect at once.
CORE = ("allocation", "segment", "active", "inactive_split", "allocated_bytes",
        "reserved_bytes", "active_bytes", "inactive_split_bytes", "requested_bytes")
COUNTERS = ("num_alloc_retries", "num_ooms", "num_sync_all_streams", "num_device_alloc",
            "num_device_free")
# No max_split_size is configured (PYTORCH_CUDA_ALLOC_CONF is not read): torch then reports
# SIZE_MAX as a signed 64-bit int, -1, and no allocation or segment is over-size. UNCONFIRMED:
# the -1 is read from the conversion of std::numeric_limits<size_t>::max() to int64_t.
MAX_SPLIT_SIZE_UNSET = -1


class Stat:
    """One statistic: current value, its peak, and its historical increase and decrease."""

    __slots__ = ("current", "peak", "allocated", "freed")

    def __init__(self) -> None:
        self.current = self.peak = self.allocated = self.freed = 0

    def add(self, n: int) -> None:
        self.current += n
        self.allocated += n
        if self.current > self.peak:
            self.peak = self.current

    def sub(self, n: int) -> None:
        self.current -= n
        self.freed += n

    def as_dict(self) -> dict[str, int]:
        return {"current": self.current, "peak": self.peak, "allocated": self.allocated,
                "freed": self.freed}


class DeviceStats:
    """One allocator's statistics (one device's, as torch keeps them). The tables are made on
    first use: a sweep makes an allocator per rank per scenario, most never asked."""

    def __init__(self) -> None:
        self._core: dict[str, dict[str, Stat]] | None = None
        self.counters = dict.fromkeys(COUNTERS, 0)

    @property
    def core(self) -> dict[str, dict[str, Stat]]:
        if self._core is None:
            core = {name: {pool: Stat() for pool in POOLS}
                    for name in CORE if name not in ("active", "active_bytes")}
            core["active"] = core["allocation"]
            core["active_bytes"] = core["allocated_bytes"]
            self._core = core
        return self._core

    def change(self, name: str, small: bool, n: int) -> None:
        """Add `n` (subtract when negative) to statistic `name` of the request's pool and of
        "all"."""
        pools = self.core[name]
        for stat in (pools["all"], pools["small_pool" if small else "large_pool"]):
            if n >= 0:
                stat.add(n)
            else:
                stat.sub(-n)

    def count(self, counter: str) -> None:
        self.counters[counter] += 1

    def reset_peak(self) -> None:
        """torch.cuda.reset_peak_memory_stats: every peak becomes the current value."""
        for pools in self.core.values():
            for stat in pools.values():
                stat.peak = stat.current

    def reset_accumulated(self) -> None:
        """torch.cuda.reset_accumulated_memory_stats: the historical totals and the event
        counters restart at zero."""
        for pools in self.core.values():
            for stat in pools.values():
                stat.allocated = stat.freed = 0
        self.counters = dict.fromkeys(COUNTERS, 0)

    def nested(self) -> dict[str, Any]:
        """What torch._C._cuda_memoryStats(device) returns (memory_stats_as_nested_dict)."""
        out: dict[str, Any] = {name: {pool: s.as_dict() for pool, s in pools.items()}
                               for name, pools in self.core.items()}
        out.update(self.counters)
        out["max_split_size"] = MAX_SPLIT_SIZE_UNSET
        # Nothing is over-size without a max_split_size: both statistics stay at zero.
        out.update({name: Stat().as_dict() for name in ("oversize_allocations", "oversize_segments")})
        return out
