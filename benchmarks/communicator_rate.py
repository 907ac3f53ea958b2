"""End-to-end scenario rate and simulated data-path bandwidth (prints figures; no assertions).

    .venv/bin/python benchmarks/communicator_rate.py

1. Scenario rate: init, 3 checked all-reduces, capture + registration, close — for TP 8 on one
   HGX host and TP 72 on a GB200 rack.
2. Data path: all-reduce GB/s of input (8 ranks x message size / time) for 1-64 MiB, against
   numpy doing the same 8-way float32 sum of the same bytes; under the default order and with
   symmetric memory first (multimem over its multicast object on HGX).
"""

from __future__ import annotations

import time

import numpy as np

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


def datapath(reps: int = 3, order: tuple[str, ...] = ("ipc", "fabric", "multicast", "nccl")) -> None:
    """Time only the all-reduce calls (after init) of 8 ranks on HGX, float32."""
    import torch
    from commsim.communicator import Communicator
    from commsim.group import LocalWorld
    from commsim.policy import Policy
    from commsim.sim import SimFabric, spawn_driver

    print(f"\n{'size':>6} {'backend/alg':>20} {'sim GB/s':>9} {'numpy GB/s':>11} {'ratio':>6}")
    for mb in (1, 4, 16, 64):
        size = mb * MiB
        c = build_preset("hgx-h100-8")
        fabric = SimFabric(c)
        drivers = [spawn_driver(fabric, g) for g in c.gpu_refs()]
        pol = Policy(order=order, params={"max_size": 128 * MiB, "multicast_max_size": 128 * MiB,
                                          "symm_max_size": 128 * MiB})
        times, names = [], []

        def rank(g):
            comm = Communicator(g, drivers[g.rank], pol)
            x = torch.ones(size // 4, dtype=torch.float32)
            comm.all_reduce(x)
            g.barrier()
            t = time.perf_counter()
            for _ in range(reps):
                comm.all_reduce(x)
            g.barrier()
            if g.rank == 0:
                times.append((time.perf_counter() - t) / reps)
                ch = next(iter(comm.choices.values()))
                names.append(f"{ch.backend}/{ch.algorithm}")
            comm.close()

        LocalWorld(8, 0).run(rank)
        sim = 8 * size / times[0] / 1e9          # input bytes of all ranks per second
        bufs = [np.ones(size // 4, np.float32) for _ in range(8)]
        t = time.perf_counter()
        for _ in range(reps):                    # the same sum, done once: 8 inputs -> 1
            acc = bufs[0].copy()
            for b in bufs[1:]:
                acc += b
        ref = 8 * size / ((time.perf_counter() - t) / reps) / 1e9
        print(f"{mb:>4}Mi {names[0]:>20} {sim:9.2f} {ref:11.2f} {sim / ref:6.2f}")


if __name__ == "__main__":
    from commsim.sim import set_torch_threads
    set_torch_threads()   # as a run does
    rate("hgx-h100-8", 5)
    rate("gb200-nvl72", 1)
    datapath()
    datapath(order=("symm", "nccl"))
