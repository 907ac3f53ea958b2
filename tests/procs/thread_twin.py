"""Thread-mode twin of `commsim.procs.launcher.run_ranks_procs`: the same rank function, the
same answer format, so a check of the driver and group layer can be asserted equal in both
modes."""

from __future__ import annotations

from typing import Any, Callable, Sequence

from commsim.group import LocalWorld
from commsim.sim import SimFabric, spawn_driver
from commsim.topology.model import Cluster, GpuRef


def run_ranks_threads(fn: Callable[[Any, Any], Any], cluster: Cluster,
                      placement: Sequence[GpuRef], *, seed: int = 0) -> list[tuple[str, Any]]:
    fabric = SimFabric(cluster, seed)
    drivers = [spawn_driver(fabric, g) for g in placement]
    outcomes = LocalWorld(len(placement), seed).run(lambda wg: fn(wg, drivers[wg.rank]))
    for d in drivers:
        fabric.exit_process(d.proc.pid)
    return [("ok", o.value) if o.ok else ("error", f"{type(o.error).__name__}: {o.error}")
            for o in outcomes]
