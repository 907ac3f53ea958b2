"""Planted defects, one at a time: a small in-process sweep must report each with the right
failure kind and a replay command that reproduces it. (Worker processes would not see the
monkeypatch, so these sweeps run with jobs=1.) Each starts with a control: the same ids,
unpatched, show no failure of that kind."""

from __future__ import annotations

import random
import weakref

import numpy as np
import pytest
import torch

from commsim.backends.base import Eligibility
from commsim.backends.fabric import FabricBackend
from commsim.backends.ipc import IpcBackend
from commsim.runtime.scheduler import current_scheduler
from commsim.policy import Policy
from commsim.scenario.sweep import run_one, run_sweep, select_ids
from commsim.kernels import collectives as K, workspace as W


def sweep(ids, determinism="sample"):
    return run_sweep(ids, jobs=1, determinism=determinism)


def assert_reported(ids, kind, determinism="sample", detail=""):
    rep = sweep(ids, determinism)
    hits = [r for r in rep.records if kind in r["kinds"]
            and any(f["kind"] == kind and detail in f["detail"] for f in r["failures"])]
    assert hits, f"the planted defect was not reported as {kind}: {rep.kind_counts()}"
    assert not rep.ok
    summary = rep.summary()
    first = hits[0]
    assert first["replay"] == f"commsim replay {first['id']}"
    assert first["replay"] in summary or "more (see the JSON report)" in summary
    # The replay reproduces it (a random defect, by its nature, only within a few tries).
    tries = 8 if kind == "nondeterministic" else 1
    assert any(kind in run_one(first["id"], determinism)["kinds"] for _ in range(tries))
    return rep, hits


def control(ids, kind, determinism="sample", detail=""):
    rep = sweep(ids, determinism)
    bad = [r for r in rep.records
           if any(f["kind"] == kind and detail in f["detail"] for f in r.get("failures", []))]
    assert not bad, bad[:1]


def test_wrong_eligibility_rule_is_an_illegal_backend(monkeypatch: pytest.MonkeyPatch) -> None:
    """(a) IpcBackend.eligibility forgets that legacy IPC handles are host-local."""
    ids = select_ids(100, seed=11, filters=["multihost"])
    control(ids, "illegal-backend", detail="admitted ipc")
    orig = IpcBackend.eligibility.__func__

    def ignores_hosts(cls, view, params):
        e = orig(cls, view, params)
        rest = tuple(r for r in e.reasons if "host-local" not in r)
        return Eligibility(not rest, rest)

    monkeypatch.setattr(IpcBackend, "eligibility", classmethod(ignores_hosts))
    assert_reported(ids, "illegal-backend", detail="admitted ipc")


def test_forgotten_unmap_is_a_leak(monkeypatch: pytest.MonkeyPatch) -> None:
    """(b) FabricBackend.close skips one cuMemUnmap."""
    ids = select_ids(100, seed=12, filters=["gb200-nvl72:", "clean"])
    control(ids, "leak")
    orig = FabricBackend.close

    def leaky_close(self):
        if not self.closed and self.mapped:
            self.mapped.pop()          # this slot is never unmapped
        orig(self)

    monkeypatch.setattr(FabricBackend, "close", leaky_close)
    assert_reported(ids, "leak")


def test_dropped_contribution_is_a_numerics_failure(monkeypatch: pytest.MonkeyPatch) -> None:
    """(c) the one-shot all-reduce kernel leaves out the last rank's input."""
    ids = select_ids(100, seed=13, filters=["all_reduce", "clean"])
    control(ids, "numerics")

    def one_shot_all_reduce(ctx, ptrs, me, n, dtype, capacity, rnd):
        dt = K.torch_dtype(dtype)
        esz = torch.empty(0, dtype=dt).element_size()
        K._barrier(ctx, ptrs, me, W.START, rnd, "one-shot start")
        acc = torch.zeros(n, dtype=torch.float32)
        for p in ptrs[:-1]:            # the last rank's contribution is dropped
            acc += K._t(ctx.array(p + W.DATA, np.uint8, n * esz), dt).float()
        K._t(ctx.array(ptrs[me] + W.DATA + capacity, np.uint8, n * esz), dt).copy_(acc.to(dt))
        K._barrier(ctx, ptrs, me, W.END, rnd, "one-shot end")

    monkeypatch.setattr(K, "one_shot_all_reduce", one_shot_all_reduce)
    assert_reported(ids, "numerics")


def test_unseeded_choice_is_nondeterministic(monkeypatch: pytest.MonkeyPatch) -> None:
    """(d) Policy.candidates shuffles the order with an unseeded random source. The shuffle is
    drawn once per run and op (every rank of a run sees the same one), so the ranks agree and
    only the runs differ: a shuffle per rank would split the ranks' collectives, and a torch
    error inside a rank's greenlet can then crash the process (see the sweep report)."""
    ids = select_ids(100, seed=14, filters=["onehost", "clean"])
    control(ids, "nondeterministic", determinism="all")
    rnd = random.SystemRandom()
    per_run: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

    def shuffled(self, op, nbytes):
        run = per_run.setdefault(current_scheduler(), {})
        if (op, nbytes) not in run:
            order = list(self.order)
            rnd.shuffle(order)
            run[(op, nbytes)] = tuple(order)
        return run[(op, nbytes)]

    monkeypatch.setattr(Policy, "candidates", shuffled)
    assert_reported(ids, "nondeterministic", determinism="all")
