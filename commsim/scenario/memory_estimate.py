"""How much host memory a scenario will need, before running it (for `scenario check` and
its memory guard, and for sizing CI).

The estimate is an upper bound built from what the run actually holds:
- the process itself (Python, numpy, torch, commsim imported): BASE_BYTES;
- per rank: its simulated process, driver, ledger and greenlet: RANK_BYTES;
- simulated device memory touched: workspaces are reserved lazily and cost host memory only
  where written (commsim/sim/fabric.py MemoryProvider), so each rank of a group pays its
  result of each message size it sends (the kernel writes it into its workspace; an
  all-gather's result is group-size times its input) and its staged input below SHARED_MIN
  bytes; from SHARED_MIN on the staged input maps the pages of the one input tape
  (commsim/sim/shared_pages.py) and costs its two partial end pages at most. A multicast
  result is shared between the members too, which this bound does not count on (it does
  not know the backend);
- the reference of the largest op (commsim/scenario/reference.py): the shared input tape,
  its integer copy, the exact sum and the rounded expected result: O(message), not
  O(ranks x message);
- a graph capture keeps every rank's input copy and output until the replay: ranks x message;
- the fallback (nccl) sums a message per rank at a time in float32.

Calibrated against measured peak RSS (benchmarks/rack_scale.py prints both): the GB200 NVL72
rack scenario (433 MB measured, 1158 MB estimated: its 8 MiB multicast results are shared
between members, which the bound leaves out) and the ladder of 8, 72, 144 and 576 ranks (260,
289, 267 and 327 MB measured; 363, 446, 539 and 1098 MB estimated) are each within the
estimate.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from commsim.sim.shared_pages import PAGE
from commsim.scenario.model import Scenario
from commsim.scenario.message import SHARED_MIN

MiB = 1 << 20
BASE_BYTES = 320 * MiB     # measured: 234 MiB after `import commsim.scenario.runner`, plus heap
RANK_BYTES = 1 * MiB       # measured: (peak RSS of 576 ranks - of 72 ranks) / 504 = 0.47 MB, doubled
ESIZE = {"float32": 4, "float16": 2, "bfloat16": 2}
# The largest workspace of any backend by default (multicast_max_size, symm_max_size); a larger
# message goes to the nccl fallback, which sums on the host and touches no device memory. A
# preset policy's own limits are read when the scenario names one.
DEVICE_PATH_MAX = 64 * MiB


def _device_path_max(sc: Scenario) -> int:
    from commsim.policy import PRESET_POLICIES
    pol = PRESET_POLICIES.get(sc.policy) if isinstance(sc.policy, str) else None
    params = dict(getattr(pol, "params", {}) or {})
    keys = ("max_size", "multicast_max_size", "symm_max_size")
    return max([DEVICE_PATH_MAX] + [int(params[k]) for k in keys if k in params])


@dataclass
class MemoryEstimate:
    total: int
    parts: dict[str, int] = field(default_factory=dict)

    def describe(self) -> str:
        rows = ", ".join(f"{k} {v / MiB:.0f} MiB" for k, v in self.parts.items() if v)
        return f"about {self.total / MiB:.0f} MiB of host memory at peak ({rows})"


def _out_bytes(op: str, size: int, group_size: int) -> int:
    if op == "all_gather":
        return size * group_size
    if op == "reduce_scatter":
        return max(size // group_size, 1)
    return size


def _staged_bytes(size: int) -> int:
    """Host bytes a staged input of `size` bytes costs in a workspace."""
    return size if size < SHARED_MIN else 2 * PAGE


def estimate_host_bytes(sc: Scenario) -> MemoryEstimate:
    """An upper bound on the peak host memory (RSS) of running `sc` in thread mode."""
    wl = sc.workload
    ranks = len(sc.placement)
    cap = _device_path_max(sc)
    touched = reference = capture = fallback = 0
    for g in sc.groups:
        gs = len(g.ranks)
        # Inputs and results of every size land in a workspace that stays mapped until the
        # group's communicator closes: the sizes add up.
        per_rank = sum(_staged_bytes(size) + _out_bytes(op, size, gs) for op in wl.ops
                       for size in set(wl.sizes) if (size * gs if op == "all_gather" else size) < cap)
        touched += gs * per_rank
        big = max(wl.sizes, default=0)
        if not big:
            continue
        for dt in wl.dtypes:
            numel = max(big // ESIZE[dt], 1)
            # tape in the dtype + int8 copy + int32 sum + rounded expected + check chunks
            reference = max(reference, big + numel + 4 * numel + big + 16 * MiB)
            # nccl: one rank at a time sums the group's inputs in float32 and returns a copy
            fallback = max(fallback, 4 * numel + 2 * big)
        if wl.graph_capture:
            capture = max(capture, gs * sum(2 * _out_bytes(op, big, gs) for op in wl.ops))
    parts = {"process": BASE_BYTES, "ranks": ranks * RANK_BYTES, "device memory touched": touched,
             "reference": reference, "capture": capture, "fallback sum": fallback}
    return MemoryEstimate(sum(parts.values()), parts)
