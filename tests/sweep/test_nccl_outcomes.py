"""The sweep sees NCCL's outcomes: commsim's `nccl` backend runs the simulated NCCL through the
ranks' drivers, and the oracle (commsim/scenario/nccl_truth.py) knows from the machine alone
where NCCL must hang, must return wrong bytes or must fail its set-up, and where it must be
exact. Generated ids of seed 7, one per outcome; planted defects in NCCL are reported."""

from __future__ import annotations

import pytest

from commsim.backends.nccl import NcclBackend, _collective
from commsim.libmodels.nccl import nvls
from commsim.scenario.nccl_truth import nccl_outcome
from commsim.scenario.sweep import run_sweep
from commsim.topology.model import GpuRef
from commsim.topology.presets import build

WRONG = "s7-8"       # hgx-h200-8 tp2, p2p_writes_lost(hgx-h200-0 0-1 corrupt)
HANGS = "s7-146"     # gh200-nvl32:8, p2p_writes_lost(gh200-nvl32-node00 0-1 dropped)
FAILS = "s7-108"     # gh200-nvl32:2*2 tp4, no_nvidia_caps on a host of the group: NVLS refused
IDS = [WRONG, HANGS, FAILS]


def _records():
    return {r["id"]: r for r in run_sweep(IDS, jobs=1).records}


def test_each_outcome_is_expected_and_named():
    recs = _records()
    for sid, why in ((WRONG, "corrupts peer writes"), (HANGS, "drops peer writes"),
                     (FAILS, "no /dev/nvidia-caps")):
        r = recs[sid]
        assert r["ok"], (sid, r["failures"])
        assert any(n.startswith("NCCL's outcome") and why in n for n in r["notes"]), (sid, r["notes"])


def test_a_nccl_that_does_not_use_its_connections_is_reported(monkeypatch: pytest.MonkeyPatch):
    """Planted: the backend combines the ranks' inputs directly, as before NCCL ran on the
    machine: lost and garbled peer writes no longer reach the result."""
    def combined(self, op, x):
        a = x.contiguous().numpy()
        res = self.group.combine_arrays(a, _collective, (op, str(x.dtype).removeprefix("torch.")),
                                        tag=f"planted {op}")
        import torch
        out = torch.from_numpy(res.copy()).view(x.dtype)
        if op == "reduce_scatter":
            per = x.numel() // self.ws
            out = out[self.rank * per:(self.rank + 1) * per]
        return out.reshape(x.shape) if op.startswith("all_reduce") else out
    monkeypatch.setattr(NcclBackend, "run", combined)
    recs = _records()
    for sid, want in ((WRONG, "must be wrong"), (HANGS, "must hang")):
        assert "nccl-outcome" in recs[sid]["kinds"], (sid, recs[sid]["failures"])
        assert any(want in f["detail"] for f in recs[sid]["failures"])


def test_a_nccl_that_skips_multicast_is_reported(monkeypatch: pytest.MonkeyPatch):
    """Planted: NVLS set-up claims success without creating the multicast object, so the
    host without /dev/nvidia-caps never refuses it."""
    monkeypatch.setattr(nvls, "setup", lambda conn, version, forced: "NVLS on (planted)")
    r = _records()[FAILS]
    assert "nccl-outcome" in r["kinds"], r["failures"]
    assert any("set-up must fail" in f["detail"] for f in r["failures"])


def test_the_truth_per_fault_class():
    """nccl_outcome over small machines: exact on a sound one; each fault its outcome."""
    from commsim.scenario.fault_registry import apply_machine_fault
    import commsim.scenario.faults  # noqa: F401  (registers the fault kinds)
    from commsim.scenario.model import Fault
    h100 = build("hgx-h100-8")
    gpus = (GpuRef("hgx-h100-0", 0), GpuRef("hgx-h100-0", 1))
    assert nccl_outcome(h100, gpus).clean
    pair = dict(host="hgx-h100-0", gpus=(0, 1))
    cases = {
        "dropped": (Fault("p2p_writes_lost", cause="dropped", **pair), (), "hangs"),
        "corrupt": (Fault("p2p_writes_lost", cause="corrupt", **pair), (), "wrong"),
        "caps": (Fault("no_nvidia_caps", host="hgx-h100-0"), (), "fails"),
        "caps, NVLS off": (Fault("no_nvidia_caps", host="hgx-h100-0"),
                           (("NCCL_NVLS_ENABLE", "0"),), None),
        "ipc refused, cuMem off": (Fault("p2p_ipc_refused", cause="acs", **pair),
                                   (("NCCL_CUMEM_ENABLE", "0"),), "fails"),
        "p2p disabled": (Fault("p2p_disabled", **pair), (), None),
    }
    for name, (fault, env, field) in cases.items():
        o = nccl_outcome(apply_machine_fault(h100, fault), gpus, env)
        got = [f for f in ("fails", "hangs", "wrong") if getattr(o, f)]
        assert got == ([field] if field else []), (name, o)


def test_ranks_of_other_groups_waiting_on_a_hung_nccl_group_are_its_outcome():
    """s0-53: rtx4090-8 tp4xdp2+dp, GPUs 2-3 drop peer writes. tp0's NCCL hangs (expected);
    tp1's ranks then wait in their data-parallel groups' discovery for tp0's ranks: the same
    hang seen from the other side, not a defect of its own."""
    r = run_sweep(["s0-53"], jobs=1).records[0]
    assert r["ok"], r["failures"]
    waiting = [n for n in r["notes"] if n.startswith("NCCL's outcome: rank 4 at discover: hang")]
    assert waiting and "drops peer writes" in waiting[0], r["notes"]


def test_peers_of_a_failed_nccl_set_up_quoted_either_way_are_its_outcome():
    """s0-1664: an injected import failure stops rank 0's NCCL (MNNVL's self-test); the ranks
    of the other groups stop waiting for it, their RankFailed quoting SetupFailed('nccl ...')
    with single quotes (its text holds a double quote)."""
    r = run_sweep(["s0-1664"], jobs=1).records[0]
    assert r["ok"], r["failures"]
