"""Reaping one fabric's closed fds touches that fabric's processes only, and of those only the
ones holding an fd (a walk over every fd table of the interpreter made each memory query cost
O(all drivers ever made), and one over every process of the fabric O(ranks): quadratic over
the suite's generated scenarios in one worker, and over a 576-rank run).

The cost is also checked without a clock: the Python lines a reap runs (every frame, the
standard library's weak-reference containers included) must not grow with the number of other
fabrics alive. The walk that filtered every table by fabric id reaped the right tables too, so
only a count of the work tells it apart."""

from __future__ import annotations

import gc
import os
import sys
from typing import Callable

from commsim.driver import alloc_prop, check
from commsim.sim import real_fds
from commsim.sim.driver import FD, SimDriver
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


def _export(d: SimDriver) -> int:
    h = check("cuMemCreate", d.cuMemCreate(1 << 21, alloc_prop(0, FD), 0))
    return check("cuMemExportToShareableHandle", d.cuMemExportToShareableHandle(h, FD, 0))


def test_reap_visits_only_the_fabrics_tables_that_hold_an_fd(monkeypatch) -> None:
    keep = [_fabric_with_drivers(2) for _ in range(5)]            # other live fabrics
    others = [_export(ds[0]) for _, ds in keep]                     # holding fds of their own
    fabric, drivers = _fabric_with_drivers(3)
    fd = _export(drivers[1])
    assert drivers[1].ledger.count("exported_fd") == 1
    visited: list[object] = []
    reap = real_fds.FdTable.reap

    def spy(self) -> None:
        visited.append(self._driver())
        reap(self)

    monkeypatch.setattr(real_fds.FdTable, "reap", spy)
    real_fds.reap_fabric(fabric)
    assert visited == [drivers[1]]
    os.close(fd)                          # the program closes it: the next reap drops it
    real_fds.reap_fabric(fabric)
    assert drivers[1].ledger.count("exported_fd") == 0
    visited.clear()
    real_fds.reap_fabric(fabric)
    assert visited == []                  # no table of this fabric holds an fd any more
    for o in others:
        os.close(o)
    assert keep  # the other fabrics stayed alive during the reap


def _lines_run(fn: Callable[[], None]) -> int:
    """How many Python lines fn() executes, in every frame it calls. The collector is off
    meanwhile, so no weak-reference callback of unrelated garbage runs inside the count."""
    count = 0

    def tracer(frame, event, arg):      # noqa: ANN001 (sys.settrace's signature)
        nonlocal count
        if event == "line":
            count += 1
        return tracer

    gc.collect()
    gc.disable()
    before = sys.gettrace()             # a coverage tracer, say: put it back afterwards
    sys.settrace(tracer)
    try:
        fn()
    finally:
        sys.settrace(before)
        gc.enable()
    return count


def test_reap_work_does_not_grow_with_other_live_fabrics() -> None:
    fabric, drivers = _fabric_with_drivers(3)
    others = [_fabric_with_drivers(4) for _ in range(2)]
    few = _lines_run(lambda: real_fds.reap_fabric(fabric))
    others += [_fabric_with_drivers(4) for _ in range(10)]
    many = _lines_run(lambda: real_fds.reap_fabric(fabric))
    assert few > 0, "the line count saw nothing of the reap"
    assert many == few, (f"reaping one fabric ran {few} Python lines with 2 other fabrics alive "
                         f"and {many} with 12: it walks the other fabrics' fd tables")
    assert len(others) == 12 and drivers   # all of them alive through both counts
