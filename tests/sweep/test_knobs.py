"""Shortcut-policy knob scenarios (k<seed>-<index>, commsim/scenario/knobs.py): the sampler
ids they replace leave every other id as it was; the oracle derives from the truth whether a
knob must fail a run, and a planted defect in a knob path is reported as `knob-outcome`."""

from __future__ import annotations

import dataclasses
from typing import Callable

import pytest

from commsim.backends.base import Backend, PeerBackend
from commsim.communicator import Communicator
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
    # No faults of its own; a failure-hygiene knob adds the set-up failure it acts on.
    assert p.knob and G.scenario_from_id(knob[0]).policy.params[p.knob[0]] is not None
    assert p.faults == () or K.get_knob(p.knob[0]).provoke is not None
    assert select_ids(3, seed=1, filters=["gpus_per_node"])[0].startswith("k")


@pytest.mark.parametrize("knob,kind,seed", [("workspace_index", "cuda-error", 1), ("workspace_index", "", 1),
                                            ("gpus_per_node", "illegal-backend", 1), ("gpus_per_node", "", 1),
                                            ("force_algorithm", "cuda-error", 2),   # rarer: ipc-best all-reduces
                                            ("rollback", "", 1), ("agree", "", 1), ("report_fallback", "", 1)])
def test_the_oracle_expects_what_each_knob_does(knob: str, kind: str, seed: int) -> None:
    for sid in _ids_expecting(seed, knob, kind, 2):
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


# -- failure hygiene (FH1-FH3): the knob scenario provokes a set-up failure from the truth ----------
HYGIENE = ("rollback", "agree", "report_fallback")
EXPECTED_KIND = {"rollback": "leak", "agree": "cuda-error", "report_fallback": "cuda-error"}
SHOWN = {"rollback": "leak: ", "agree": "CollectiveMismatch", "report_fallback": "SilentFallback: silently fell back to nccl"}


def test_each_hygiene_knob_is_drawn_in_a_sweep_and_its_expected_failures_show() -> None:
    """A sampler sweep of 300 ids holds knob scenarios of each failure-hygiene knob; they run
    clean (the failure each must cause is there and became a note), and each knob has a
    drawn case where it must fail the run."""
    ids = [s for s in select_ids(300, seed=0) if s.startswith("k")]
    drawn = {G.plan_from_id(s).knob[0] for s in ids}
    assert set(HYGIENE) <= drawn, drawn
    rep = run_sweep([s for s in ids if G.plan_from_id(s).knob[0] in HYGIENE], jobs=1, determinism="none")
    assert all(r["ok"] for r in rep.records), [(r["id"], r["failures"]) for r in rep.records if not r["ok"]]
    for knob in HYGIENE:
        shown = [r["id"] for r in rep.records if any(n.startswith(f"expected under knob {knob}") and SHOWN[knob] in n
                                                       for n in r["notes"])]
        assert shown, f"no drawn {knob} case failed as expected"


def test_the_provocation_comes_from_the_truth() -> None:
    """Where ipc is legal for the group, one of its ranks runs out of memory at its first
    allocation (the ipc workspace); where no group allows ipc, nothing is added and the knob
    must be harmless. A knob that acts alone gets no fault."""
    from commsim.scenario.legal import group_truth
    seen = {True: 0, False: 0}
    for i in range(120):
        p = G.plan_from_id(f"k2-{i}")
        sc = G.build(p)
        legal = [g for g in sc.groups if "ipc" in group_truth(sc, g.ranks, g.name, K.ORDER).legal]
        if p.knob[0] not in HYGIENE:
            assert p.faults == ()
            continue
        exps = K.get_knob(p.knob[0]).expect(sc, p.knob[1])
        if not legal:
            assert p.faults == () and exps == [], p.id
        elif p.faults:
            (f,) = p.faults
            assert (f.kind, f.at_allocation) == ("oom", 1) and any(f.rank in g.ranks for g in legal)
            assert exps and exps[0].why.startswith(f"group ")
        seen[bool(p.faults)] += 1
    assert seen[True] and seen[False], seen


@pytest.mark.parametrize("knob", HYGIENE)
def test_the_hygiene_knob_fails_the_run_the_way_the_truth_says(knob: str) -> None:
    sid = _ids_expecting(1, knob, EXPECTED_KIND[knob], 1)[0]
    rec = run_one(sid, "none")
    assert rec["ok"], rec["failures"]
    assert any(n.startswith(f"expected under knob {knob}") and SHOWN[knob] in n for n in rec["notes"]), rec["notes"]
    # The same scenario under the default policy (the knob unset) is clean: the knob did it.
    from commsim.scenario.oracle import judge
    from commsim.scenario.runner import run_scenario
    sc = G.scenario_from_id(sid)
    plain = dataclasses.replace(sc, policy=K.policy_of(("max_size", 8 << 20)), extra={**sc.extra, "knob": ()})
    assert judge(plain, run_scenario(plain)).ok


def _ignore_rollback(monkeypatch: pytest.MonkeyPatch) -> None:
    orig = Communicator._init_backends

    def init(self: Communicator) -> None:
        orig(self)
        for b in self.abandoned:           # rolled back after all
            b.close()
        self.abandoned.clear()
    monkeypatch.setattr(Communicator, "_init_backends", init)


def _ignore_agree(monkeypatch: pytest.MonkeyPatch) -> None:
    orig = Backend.vote

    def vote(self: Backend, step: str, error: Exception | None) -> None:
        saved, self.params = self.params, {**self.params, "agree": True}
        try:
            orig(self, step, error)
        finally:
            self.params = saved
    monkeypatch.setattr(Backend, "vote", vote)


def _ignore_report_fallback(monkeypatch: pytest.MonkeyPatch) -> None:
    orig = Communicator._init_backends

    def init(self: Communicator) -> None:
        orig(self)
        self.silent_fallbacks.clear()      # the audit never sees the silent fallback
    monkeypatch.setattr(Communicator, "_init_backends", init)


@pytest.mark.parametrize("knob,plant", [("rollback", _ignore_rollback), ("agree", _ignore_agree),
                                        ("report_fallback", _ignore_report_fallback)])
def test_planted_defect_in_a_hygiene_knob_is_a_knob_outcome(knob: str, plant: Callable, monkeypatch: pytest.MonkeyPatch) -> None:
    """The knob's shortcut silently not taken: the runs the truth says must fail pass."""
    kind = EXPECTED_KIND[knob]
    ids = _ids_expecting(1, knob, kind, 2)
    plant(monkeypatch)
    rep = run_sweep(ids, jobs=1, determinism="none")
    bad = [r for r in rep.records if "knob-outcome" in r["kinds"]]
    assert len(bad) == 2, rep.kind_counts()
    assert f"knob {knob}=False must fail the run with {kind}" in bad[0]["failures"][0]["detail"]


def test_planted_defect_where_a_hygiene_knob_must_be_harmless_is_a_knob_outcome(monkeypatch: pytest.MonkeyPatch) -> None:
    """A silent-fallback audit that fires without any set-up failure: where set-up never fails
    (no provocation), the knob must be harmless, and the oracle says it was not."""
    ids = _ids_expecting(1, "report_fallback", "", 3)
    orig = Communicator._init_backends

    def init(self: Communicator) -> None:
        orig(self)
        if not self.policy.params.get("report_fallback", True):
            self.silent_fallbacks.append((self.step, "silently fell back to nccl (planted)"))
    monkeypatch.setattr(Communicator, "_init_backends", init)
    rep = run_sweep(ids, jobs=1, determinism="none")
    assert all("knob-outcome" in r["kinds"] for r in rep.records), rep.kind_counts()
    assert "must be harmless" in rep.records[0]["failures"][-1]["detail"]



def _expects_both(sid: str) -> bool:
    p = G.plan_from_id(sid)
    kinds = {e.kind for e in K.get_knob(p.knob[0]).expect(G.build(p), p.knob[1])}
    return p.knob[0] == "workspace_index" and {"cuda-error", "numerics"} <= kinds

def test_an_expected_error_excuses_the_numerics_it_hides(monkeypatch: pytest.MonkeyPatch) -> None:
    """LOCAL_RANK slots past the list in one group (cudaErrorInvalidValue) and permuted in
    another (numerics): the error's hang ends the other group's ranks before their results
    count, so the numerics are not owed (sweep k14-5109). With the shortcut ignored, the
    missing error is still a knob-outcome."""
    ids = ["k14-5109", "k1-3824"]          # rare: found by scanning 16,000 knob ids
    assert all(map(_expects_both, ids))
    for sid in ids:
        rec = run_one(sid, "none")
        assert rec["ok"], rec["failures"]
    monkeypatch.setattr(PeerBackend, "_slot", lambda self: self.rank)
    rec = run_one(ids[0], "none")
    assert "knob-outcome" in rec["kinds"], rec
