"""Reaping one fabric's closed fds touches that fabric's processes only (a walk over every
fd table of the interpreter made each memory query cost O(all drivers ever made): the suite's
generated scenarios ran quadratically slower in one worker)."""

from __future__ import annotations

from commsim.sim import real_fds
from commsim.sim.driver import SimDriver
from commsim.sim.fabric import SimFabric
from commsim.topology.model import GpuRef
from commsim.topology.presets import build


def _fabric_with_drivers(n: int) -> tuple[SimFabric, list[SimDriver]]:
    cluster = build("hgx-h100-8")
    fabric = SimFabric(cluster)
    host = cluster.hosts[0]
    drivers = [SimDriver(fabric, fabric.spawn(host.name, [GpuRef(host.name, g.index)]))
               for g in host.gpus[:n]]
    return fabric, drivers


def test_reap_visits_only_the_fabrics_own_tables(monkeypatch) -> None:
    keep = [_fabric_with_drivers(4) for _ in range(20)]          # other live fabrics
    fabric, drivers = _fabric_with_drivers(3)
    visited: list[object] = []
    monkeypatch.setattr(real_fds.FdTable, "reap", lambda self: visited.append(self._driver()))
    real_fds.reap_fabric(fabric)
    assert sorted(id(d) for d in visited) == sorted(id(d) for d in drivers)
    assert keep  # the other fabrics stayed alive during the reap
