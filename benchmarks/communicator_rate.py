"""End-to-end scenario rate and simulated data-path bandwidth (prints figures; no assertions).

    .venv/bin/python benchmarks/communicator_rate.py

1. Scenario rate: init, 3 checked all-reduces, capture + registration, close — for TP 8 on one
   HGX host and TP 72 on a GB200 rack.
2. Data path (benchmarks/rack_scale.py's table): the kernels' sum and the whole all-reduce
   for 1-64 MiB, against numpy doing the same 8-way float32 sum of the same bytes; under the
   default order and with symmetric memory first (multimem over its multicast object on HGX).
"""

from __future__ import annotations

import time


from commsim.scenario.model import Group, Scenario, Workload
from commsim.scenario.runner import run_scenario
from commsim.topology import build_preset

KiB, MiB = 1 << 10, 1 << 20


def scenario(preset: str, sizes, capture: bool, dtype: str = "bfloat16") -> Scenario:
    c = build_preset(preset)
    refs = tuple(c.gpu_refs())
    return Scenario(name=preset, cluster=c, placement=refs, groups=(Group("tp", tuple(range(len(refs)))),),
                    workload=Workload(ops=("all_reduce",), sizes=tuple(sizes), dtypes=(dtype,),
                                      graph_capture=capture))


def rate(preset: str, reps: int) -> None:
    sc = scenario(preset, (4 * KiB, 64 * KiB, 1 * MiB), capture=True)
    run_scenario(sc)                                   # warm-up (imports, caches)
    t = time.perf_counter()
    for _ in range(reps):
        res = run_scenario(sc)
        assert res.ok, res.failures
    dt = (time.perf_counter() - t) / reps
    print(f"scenario {preset:>14}: {1 / dt:7.2f} scenarios/s ({dt * 1e3:8.1f} ms each; "
          f"backends {sorted(set(res.backends.values()))})")


def datapath(order: tuple[str, ...] = ("ipc", "fabric", "multicast", "nccl")) -> None:
    """The data-path table of benchmarks/rack_scale.py (one implementation)."""
    import os
    import sys
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from rack_scale import datapath as table
    print()
    table(order=order)


if __name__ == "__main__":
    from commsim.sim import set_torch_threads
    set_torch_threads()   # as a run does
    rate("hgx-h100-8", 5)
    rate("gb200-nvl72", 1)
    datapath()
    datapath(order=("symm", "nccl"))
