"""Shortcut-policy knob scenarios (k<seed>-<index>, commsim/scenario/knobs.py): the sampler
ids they replace leave every other id as it was; the oracle derives from the truth whether a
knob must fail a run, and a planted defect in a knob path is reported as `knob-outcome`."""

from __future__ import annotations

import pytest

from commsim.backends.base import PeerBackend
from commsim.scenario import generate as G, knobs as K
from commsim.scenario.sweep import run_one, run_sweep, select_ids


def _ids_expecting(seed: int, knob: str, kind: str, n: int, scan: int = 400) -> list[str]:
    out = []
    for i in range(scan):
        p = G.plan_from_id(f"k{seed}-{i}")
        if p.knob[0] != knob:
            continue
        exps = K.get_knob(knob).expect(G.build(p), p.knob[1])
        if (kind == "" and not exps) or any(e.kind == kind for e in exps):
            out.append(p.id)
            if len(out) == n:
                break
    assert len(out) == n, f"only {len(out)} k{seed} ids with {knob} expecting {kind or 'harmless'}"
    return out


def test_knob_ids_replace_a_few_sampler_ids_and_leave_the_rest_unchanged() -> None:
    ids = select_ids(300, seed=7)
    knob = [s for s in ids if s.startswith("k")]
    assert 5 <= len(knob) <= 30, len(knob)
    for i, sid in enumerate(ids):
        assert sid[1:] == f"7-{i}" and sid[0] == ("k" if K.is_knob_id(7, i) else "s")
    # The same draw with the same machine, layout and placement; no faults, one knob.
    p, base = G.plan_from_id(knob[0]), G.sample_plan(7, int(knob[0].split("-")[1]))
    assert (p.shape, p.tp, p.dp, p.placement, p.ops, p.sizes) == (base.shape, base.tp, base.dp,
                                                                    base.placement, base.ops, base.sizes)
    assert p.faults == () and p.knob and G.scenario_from_id(knob[0]).policy.params[p.knob[0]]
    assert select_ids(3, seed=1, filters=["gpus_per_node"])[0].startswith("k")


@pytest.mark.parametrize("knob,kind", [("workspace_index", "cuda-error"), ("workspace_index", ""),
                                       ("gpus_per_node", "illegal-backend"), ("gpus_per_node", ""),
                                       ("force_algorithm", "cuda-error")])
def test_the_oracle_expects_what_each_knob_does(knob: str, kind: str) -> None:
    for sid in _ids_expecting(1, knob, kind, 2):
        rec = run_one(sid, "none")
        assert rec["ok"], rec["failures"]
        if kind:     # the knob's failure was there, and is a note, not a finding
            assert any(n.startswith(f"expected under knob {knob}") for n in rec["notes"]), rec["notes"]


def test_planted_defect_in_the_workspace_index_path_is_a_knob_outcome(monkeypatch: pytest.MonkeyPatch) -> None:
    """The LOCAL_RANK shortcut silently ignored: the runs that must fail pass."""
    ids = _ids_expecting(1, "workspace_index", "cuda-error", 3)
    monkeypatch.setattr(PeerBackend, "_slot", lambda self: self.rank)
    rep = run_sweep(ids, jobs=1, determinism="none")
    bad = [r for r in rep.records if "knob-outcome" in r["kinds"]]
    assert len(bad) == 3, rep.kind_counts()
    assert "must fail the run with cuda-error (cudaErrorInvalidValue)" in bad[0]["failures"][0]["detail"]
    assert bad[0]["replay"] == f"commsim replay {bad[0]['id']}"


def test_planted_defect_where_a_knob_must_be_harmless_is_a_knob_outcome(monkeypatch: pytest.MonkeyPatch) -> None:
    """The LOCAL_RANK slot off by one: a placement where the knob is harmless now fails."""
    ids = _ids_expecting(1, "workspace_index", "", 12)
    orig = PeerBackend._slot
    monkeypatch.setattr(PeerBackend, "_slot",
                        lambda self: orig(self) + (1 if self.params.get("workspace_index") else 0))
    rep = run_sweep(ids, jobs=1, determinism="none")
    assert any("must be harmless" in f["detail"] for r in rep.records for f in r["failures"]), rep.kind_counts()
