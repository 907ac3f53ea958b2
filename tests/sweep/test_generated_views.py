"""The generator draws placement views (sim/visibility.py) and non-error outcomes
(scenario/outcomes.py) from streams of their own: a tenth of the plans each, the rest of
every draw as it was, and the drawn scenarios run clean under the oracle."""

from __future__ import annotations

import dataclasses

from commsim.scenario import generate as G
from commsim.scenario.sweep import run_one


def _drawn(kind: str, limit: int = 400) -> list:
    plans = [G.sample_plan(7, i) for i in range(limit)]
    return [p for p in plans if getattr(p, kind)]


def test_views_and_outcomes_are_drawn_apart_from_the_rest_of_the_plan() -> None:
    views, outcomes = _drawn("views"), _drawn("outcome")
    assert 20 <= len(views) <= 60 and 20 <= len(outcomes) <= 60
    assert {p.views for p in views} == {"reordered", "container"}
    p = views[0]
    bare = dataclasses.replace(p, views="", view_seed=0, outcome=())
    # the same machine, layout and placement as without the view
    assert G.build(bare).placement == G.build(p).placement


def test_a_reordered_view_lists_the_placed_gpus_and_runs_clean() -> None:
    p = next(p for p in _drawn("views") if p.views == "reordered")
    sc = G.build(p)
    for r, g in enumerate(sc.placement):
        words = sc.view(r).visible.split(",")
        assert len(words) >= len({x.index for x in sc.placement if x.host == g.host})
    rec = run_one(p.id, "none")
    assert rec["ok"], rec["failures"]
    assert "visible devices" in rec["description"]


def test_an_expected_transport_is_judged_and_a_wrong_one_is_an_outcome_failure() -> None:
    from commsim.scenario.oracle import judge
    from commsim.scenario.runner import run_scenario
    p = _drawn("outcome")[0]
    sc = G.build(p)
    (e,) = sc.expectations
    res = run_scenario(sc)
    assert res.outcomes and not res.unmet and judge(sc, res).ok
    other = {"P2P": "NET", "SHM": "NET", "NET": "P2P"}[e.transport]
    wrong = dataclasses.replace(sc, expectations=(dataclasses.replace(e, transport=other),))
    v = judge(wrong, run_scenario(wrong))
    assert v.kinds == ("outcome",), v.render()
