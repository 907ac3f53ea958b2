"""A deterministic slice of the enumeration, one test per scenario (ids as test ids):
each run must get a clean oracle verdict (legal and best backend, no unexpected error,
exact numerics, zero ledger, and for 1 in 20 ids the same trace on a second run).

A failure prints the scenario, the verdict and `commsim replay <id>`.
"""

from __future__ import annotations

import pytest

from commsim.scenario.generate import enum_ids, scenario_from_id
from commsim.scenario.oracle import judge
from commsim.scenario.runner import run_scenario
from commsim.scenario.sweep import wants_determinism

COUNT = 2000
IDS = enum_ids(COUNT)


@pytest.mark.parametrize("sid", IDS)
def test_generated_scenario_is_clean(sid: str) -> None:
    sc = scenario_from_id(sid)
    res = run_scenario(sc)
    again = run_scenario(sc) if wants_determinism(sid, "sample") else None
    v = judge(sc, res, again)
    assert v.ok, f"{sc.description}\n{v.render()}\nreplay: commsim replay {sid}"
