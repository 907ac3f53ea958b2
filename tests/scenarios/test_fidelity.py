"""The fidelity rules' shipped scenarios (scenarios/fidelity/): each passes as written (backends,
errors, exact results, zero ledger where it must pass), and `explain` names the fact that
decided (docs/fidelity-rules.md)."""

from __future__ import annotations

from pathlib import Path

import pytest

from commsim.scenario.runner import run_scenario
from commsim.scenario.schema import load

DIR = Path(__file__).resolve().parents[2] / "scenarios" / "fidelity"

# scenario -> (group, text its explanation must hold: the deciding fact)
DECIDED_BY = {
    "p2p-reported-ipc-refused": ("tp", "functional P2P probe, rank 0 -> rank 1: cudaIpcOpenMemHandle"),
    "p2p-patched-writes-corrupt": ("tp", "B differ, with every call returning success (row P3)"),
    "nvlink-up-p2p-disabled": ("tp", "ipc: declined: some pair of GPUs has no P2P access"),
    "nv6-mesh-no-nvswitch": ("tp", "multicast: declined: some rank lacks MULTICAST_SUPPORTED"),
    "imex-split-domain": ("world", "fabric: declined after set-up failure: fabric init: import and "
                                   "map peers: rank 0: cuMemImportFromShareableHandle failed: "
                                   "CUDA_ERROR_NOT_PERMITTED"),
    "multicast-container-no-caps": ("tp", "carrying on with multicast address 0 (row S1)"),
    "one-gpu-per-process": ("tp", "ipc: admitted"),
    "container-without-imex-channel": ("world", "rank(s) 4, 5, 6, 7 have no IMEX channel"),
    "pidfd-getfd-denied": ("tp", "EPERM: pidfd_getfd"),
    "ipc-graph-segment-current-driver": ("tp", "ipc: admitted"),
    "container-per-process": ("tp", "ipc: declined: ranks on one host are in different containers"),
    "visible-devices-reordered": ("tp", "ipc: admitted"),
    "container-device-cgroups": ("tp", "ipc: declined: some pair of GPUs has no P2P access"),
    "processes-sharing-a-gpu": ("tp", "Duplicate GPU detected : rank 1 and rank 0"),
    "visible-devices-uuid-cut": ("tp", "ipc: admitted"),
}


@pytest.mark.parametrize("path", sorted(DIR.glob("*.toml")), ids=lambda p: p.stem)
def test_fidelity_scenario_passes(path: Path) -> None:
    sc = load(path)
    res = run_scenario(sc)
    assert res.ok, res.failures
    if sc.policy == "default" and not res.expects_failure:
        assert not res.errors and not res.leaks and not res.flags
    if path.stem in DECIDED_BY:
        group, text = DECIDED_BY[path.stem]
        assert text in _explained(res, group), _explained(res, group)


def _explained(res, group: str) -> str:
    """The group's decision record: the run's explanation, or where the group's ranks failed
    (an expected failure), the decision traces their errors carry."""
    return res.explain.get(group) or "\n".join(e.trace for e in res.errors)


def test_every_issue17_fault_kind_has_a_shipped_scenario() -> None:
    from commsim.scenario.fidelity_faults import NAMES
    used = {f.kind for p in DIR.glob("*.toml") for f in load(p).faults}
    assert set(NAMES) <= used, set(NAMES) - used


def test_patched_path_needs_reported_p2p() -> None:
    """Row P3 describes P2P that is reported (cuDeviceCanAccessPeer = 1) but loses writes.
    A later p2p_disabled on the same pair leaves no reported P2P to be patched: the oracle
    (truth.p2p_unreal) then allows the same-host fabric path, so the simulator must not lose
    its writes either (sweep s11-2017 found the two disagreeing). The other order keeps the
    patched path, and the probe must still rule peer memory out; NCCL, which trusts
    cuDeviceCanAccessPeer and NVML (NC2), takes P2P over the NVLink pair and returns the
    garbled bytes, as the oracle expects of it (nccl_truth.py)."""
    from commsim.scenario.oracle import judge
    from commsim.scenario.schema import loads
    from commsim.topology.model import Link

    assert Link("NV", 18, p2p=False, peer_writes="corrupt").lost_writes == ""
    assert Link("PHB", peer_writes="dropped").lost_writes == "dropped"
    head = ('[scenario]\nname = "t"\n[topology]\npreset = "gb200-nvl72"\nhosts = 1\n'
            '[[group]]\nname = "tp"\nranks = "0..1"\n'
            '[workload]\nops = ["reduce_scatter", "all_reduce"]\nsizes = ["1KiB"]\n'
            'dtypes = ["float32"]\n')
    lost = '[[fault]]\nkind = "p2p_writes_lost"\nhost = "gb200-nvl72-tray00"\ngpus = [0, 1]\ncause = "corrupt"\n'
    off = '[[fault]]\nkind = "p2p_disabled"\nhost = "gb200-nvl72-tray00"\ngpus = [0, 1]\n'
    res = run_scenario(loads(head + lost + off, "t.toml"))
    assert res.ok and not res.mismatches, res.failures
    assert "fabric" in res.backends.values(), res.backends
    sc = loads(head + off + lost, "t.toml")
    res = run_scenario(sc)
    assert "fabric" not in res.backends.values(), res.backends
    assert "functional P2P probe" in res.explain["tp"], res.explain["tp"]
    assert res.backends[("tp", "reduce_scatter", 1024, "float32")] == "nccl", res.backends
    assert any("reduce_scatter" in m for m in res.mismatches), res.mismatches
    v = judge(sc, res, None)
    assert v.ok and any("corrupts peer writes" in n for n in v.notes), (v.failures, v.notes)


@pytest.mark.parametrize("cause", ["corrupt", "dropped"])
def test_lost_writes_seen_by_a_probe_the_rank_cannot_ask_about(cause: str) -> None:
    """One GPU per process (row W1): a rank cannot ask cuDeviceCanAccessPeer about its peer,
    so the probe is the P2P fact; bytes that come back wrong through an open that worked
    still disprove P2P (row P3), and the same-host FABRIC path must be declined, as the
    oracle says (sweep s12-1190: numerics; s12-7424: a hang on lost flags). NCCL, the
    fallback, has no probe (NC2): over the NVLink pair it hangs on the dropped flags or
    returns the garbled bytes, which the oracle expects of it (nccl_truth.py)."""
    from commsim.scenario.oracle import judge
    from commsim.scenario.schema import loads

    text = ('[scenario]\nname = "t"\n[topology]\npreset = "gb200-nvl72"\nhosts = 1\n'
            '[[group]]\nname = "tp"\nranks = "0..3"\n'
            '[workload]\nops = ["all_reduce", "all_gather"]\nsizes = ["1KiB"]\ndtypes = ["float32"]\n'
            '[[fault]]\nkind = "one_gpu_per_process"\nhost = "gb200-nvl72-tray00"\n'
            f'[[fault]]\nkind = "p2p_writes_lost"\nhost = "gb200-nvl72-tray00"\ngpus = [0, 1]\ncause = "{cause}"\n')
    sc = loads(text, "t.toml")
    res = run_scenario(sc)
    assert "fabric" not in res.backends.values(), res.backends
    assert "fabric: declined" in _explained(res, "tp") and "(row P3)" in _explained(res, "tp")
    if cause == "dropped":
        assert [e.name for e in res.errors] and all(e.name in ("hang", "RankFailed") for e in res.errors)
        assert any("NCCL nccl." in e.message for e in res.errors), res.errors
    else:
        assert not res.errors and res.mismatches, res.failures
    v = judge(sc, res, None)
    assert v.ok, v.failures


def test_sampler_leaves_out_lost_writes_between_containers() -> None:
    """No probe crosses containers (row W6) and no query reports lost writes: a sweep could
    not judge a communicator on them, so the sampler drops that fault (s12-9281 drew both)."""
    from commsim.scenario import generate as G
    from commsim.scenario.fidelity_faults import unjudgeable
    from commsim.scenario.model import Fault

    box = Fault("container_per_process", host="h")
    lost = Fault("p2p_writes_lost", host="h", gpus=(0, 1), cause="dropped")
    elsewhere = Fault("p2p_writes_lost", host="g", gpus=(0, 1), cause="dropped")
    assert unjudgeable([box, lost, elsewhere]) == [lost]
    assert unjudgeable([lost, elsewhere]) == []
    kinds = [f.kind for f in G.plan_from_id("s12-9281").faults]
    assert kinds == ["container_per_process"], kinds


@pytest.mark.parametrize("fault, fabric_legal", [
    ('kind = "p2p_ipc_refused"\ncause = "acs"', True),      # reads as no P2P (row L10)
    ('kind = "p2p_ipc_refused"\ncause = "iommu"', True),
    ('kind = "p2p_writes_lost"\ncause = "dropped"', False),  # the probe's bytes disprove it
])
def test_oracle_judges_fabric_as_a_rank_without_the_peer_sees_it(fault: str, fabric_legal: bool) -> None:
    """One GPU per process (row W1): the oracle's FABRIC rule follows what the probe can tell
    there (truth.fabric_path_disproved), so eligibility and oracle agree (sweep s14-9691:
    a refused open admitted fabric, which the oracle called illegal). Where the probe rules
    fabric out, the group falls back to NCCL, which hangs on the dropped writes (NC2: no
    probe), and the oracle expects that too."""
    from commsim.scenario.legal import group_truth
    from commsim.scenario.oracle import judge
    from commsim.scenario.schema import loads

    text = ('[scenario]\nname = "t"\n[topology]\npreset = "gb200-nvl72"\nhosts = 1\n'
            '[[group]]\nname = "tp"\nranks = "0..1"\n'
            '[workload]\nops = ["all_gather"]\nsizes = ["1KiB"]\ndtypes = ["float16"]\n'
            '[[fault]]\nkind = "one_gpu_per_process"\nhost = "gb200-nvl72-tray00"\n'
            f'[[fault]]\n{fault}\nhost = "gb200-nvl72-tray00"\ngpus = [0, 1]\n')
    sc = loads(text, "t.toml")
    assert ("fabric" in group_truth(sc, (0, 1)).legal) is fabric_legal
    res = run_scenario(sc)
    if fabric_legal:
        assert res.ok and not res.errors, res.failures
        assert "fabric" in res.backends.values(), res.backends
    else:
        assert "fabric: declined" in _explained(res, "tp"), _explained(res, "tp")
        assert res.errors and all(e.name == "hang" and "NCCL nccl." in e.message
                                  for e in res.errors if e.name != "RankFailed"), res.errors
    v = judge(sc, res, None)
    assert v.ok, v.failures
