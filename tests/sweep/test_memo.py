"""The sweep's per-worker memo (commsim/scenario/memo.py) changes no result: over 2,000 ids of
the default mix, each machine it hands out equals the one built afresh and each group's
ground truth equals the one computed afresh; a sweep of ids with it on and off reports the
same (the whole 2,000-id sweep digest, on against off: benchmarks/sweep_memo_check.py); and
its keys tell machines apart by every fault."""

from __future__ import annotations

from commsim.scenario import generate as G
from commsim.scenario import memo
from commsim.scenario.legal import group_truth
from commsim.scenario.sweep import run_sweep, select_ids

IDS = select_ids(2000, seed=7)


def _truths(sc) -> list:
    return [group_truth(sc, g.ranks, g.name) for g in sc.groups]


def test_memoized_machines_and_truths_equal_fresh_ones_over_2000_ids():
    memo.clear()
    with memo.disabled():
        fresh = {sid: G.scenario_from_id(sid) for sid in IDS}
        fresh_truths = {sid: _truths(sc) for sid, sc in fresh.items()}
    before = dict(memo.stats)
    for sid in IDS:
        sc = G.scenario_from_id(sid)
        assert sc.cluster == fresh[sid].cluster, sid
        assert _truths(sc) == fresh_truths[sid], sid
        assert _truths(sc) == fresh_truths[sid], sid       # the second ask: from the memo
    hits = {k: memo.stats[k] - before[k] for k in memo.stats}
    assert hits["machine_hits"] > 0 and hits["truth_hits"] >= len(IDS), hits


def test_a_sweep_reports_the_same_with_the_memo_on_and_off():
    ids = IDS[:60]
    memo.clear()
    on = run_sweep(ids).canonical()
    with memo.disabled():
        off = run_sweep(ids).canonical()
    assert on == off


def test_machines_that_differ_by_a_fault_get_their_own_entry():
    faulted = [G.plan_from_id(sid) for sid in IDS]
    plan = next(p for p in faulted if any(not G.F.is_driver_fault(f) for f in p.faults))
    memo.clear()
    with_fault = G.build(plan).cluster
    clean = G.build(G.dataclasses.replace(plan, faults=())).cluster
    assert with_fault is not clean
    assert G.build(plan).cluster is with_fault
