"""A deterministic slice of the enumeration, one test per scenario (ids as test ids):
each run must get a clean oracle verdict (legal and best backend, no unexpected error,
exact numerics, zero ledger, and for 1 in 20 ids the same trace on a second run).

Known open issues are matched by their exact failure signature and reported as xfail with
the reason, so a *new* failure in the same scenario still fails the test; when an issue is
fixed its scenarios simply pass.
"""

from __future__ import annotations

import pytest

from commsim.scenario.generate import enum_ids, scenario_from_id
from commsim.scenario.oracle import judge
from commsim.scenario.runner import run_scenario
from commsim.scenario.sweep import wants_determinism

COUNT = 2000
IDS = enum_ids(COUNT)


def known_issue(sc, v) -> str | None:
    fs = v.failures
    if fs and all(f.kind == "illegal-backend" and "eligibility admitted multicast" in f.detail
                  and "row M3" in f.detail for f in fs):
        return ("known: MulticastBackend.eligibility (one host) does not check the NVML fabric "
                "state; cuMulticastBindMem then fails SYSTEM_NOT_READY (row M3) and the "
                "communicator falls back")
    plan = sc.extra["plan"]
    if (fs and plan.graph_capture and any(t[0] == "oom" for t in plan.faults)
            and {f.kind for f in fs} <= {"cuda-error", "leak"}
            and any(("CollectiveMismatch" in f.detail or "hang" in f.detail)
                    for f in fs if f.kind == "cuda-error")):
        return ("known: an out-of-memory on one rank inside graph capture (IpcBackend.record) is "
                "not voted, so the ranks fall out of step; close() then mismatches and leaks")
    return None


@pytest.mark.parametrize("sid", IDS)
def test_generated_scenario_is_clean(sid: str) -> None:
    sc = scenario_from_id(sid)
    res = run_scenario(sc)
    again = run_scenario(sc) if wants_determinism(sid, "sample") else None
    v = judge(sc, res, again)
    if not v.ok:
        why = known_issue(sc, v)
        if why:
            pytest.xfail(f"{why} (commsim replay {sid})")
    assert v.ok, f"{sc.description}\n{v.render()}\nreplay: commsim replay {sid}"
