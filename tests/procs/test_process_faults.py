"""Faults across real processes. A rank killed at a step, a rank that never joins and
a rank that stops answering (its peers' store waits time out): the survivors say which rank
failed and where within a bounded time, and the run leaves no shared-memory segment and no
process behind."""

from __future__ import annotations

import os
import time

from commsim.procs.faults import ProcFaults
from commsim.procs.launcher import run_scenario_procs
from commsim.scenario.model import Group, Scenario, Workload
from commsim.topology import build_preset

from run_hygiene import leftover_segments, pid_alive

KiB = 1 << 10
TIMEOUT = 3.0
JOIN = 10.0      # the rendezvous bound for the rank that never joins (others start in time,
                 # even on a loaded 2-core machine)


def hgx_tp4() -> Scenario:
    c = build_preset("hgx-h100-8")
    return Scenario(name="hgx-tp4", cluster=c, placement=tuple(c.gpu_refs())[:4],
                    groups=(Group("tp", (0, 1, 2, 3)),),
                    workload=Workload(ops=("all_reduce",), sizes=(4 * KiB,), dtypes=("bfloat16",)),
                    seed=1)


def run(faults: ProcFaults, join_timeout: float | None = None):
    t0 = time.monotonic()
    res = run_scenario_procs(hgx_tp4(), timeout=TIMEOUT, faults=faults, join_timeout=join_timeout)
    elapsed = time.monotonic() - t0
    assert not leftover_segments(os.getpid()), leftover_segments(os.getpid())
    assert not any(pid_alive(p) for p in res.pids)
    assert not res.ok
    return res, elapsed


def test_killed_rank_is_named_with_its_step_quickly():
    res, elapsed = run(ProcFaults(kill={2: "ipc.init"}))
    dead = [e for e in res.errors if e.rank == 2]
    assert dead and dead[0].name == "RankDied" and "SIGKILL" in dead[0].message
    assert "ipc.init" in dead[0].message            # where it was when it died
    survivors = [e for e in res.errors if e.rank != 2]
    assert {e.rank for e in survivors} == {0, 1, 3}
    for e in survivors:
        assert e.name == "RankFailed" and e.step == "init"
        assert "rank 2 failed" in e.message and "ipc.init" in e.message
    # Death is noticed within the poll interval, not at the timeout: start-up plus well
    # under one timeout.
    assert elapsed < 15 + TIMEOUT, elapsed


def test_rank_that_never_joins_times_out_at_rendezvous():
    res, elapsed = run(ProcFaults(absent=frozenset({3})), join_timeout=JOIN)
    by = {e.rank: e for e in res.errors}
    assert by[3].name == "RankDied" and "never started" in by[3].message
    for r in (0, 1, 2):
        assert by[r].name == "hang" and by[r].step == "rendezvous"   # GroupTimeout: a HangDetected
        assert "rank 3 never joined" in by[r].message and "real time" in by[r].message
    assert elapsed < 15 + 2 * JOIN, elapsed


def test_stalled_rank_makes_peers_time_out_naming_it():
    res, elapsed = run(ProcFaults(stall={1: "ipc.init"}))
    by = {e.rank: e for e in res.errors}
    assert by[1].name == "RankDied" and "killed by the launcher" in by[1].message
    for r in (0, 2, 3):
        msg = by[r].message
        assert by[r].name in ("hang", "RankFailed"), msg
        assert "rank 1" in msg and "ipc.init" in msg
    # One timeout for the stalled collective, one for the close that follows, the launcher's
    # grace, and start-up.
    assert elapsed < 15 + 4 * TIMEOUT, elapsed
