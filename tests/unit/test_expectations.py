"""The expectation schema for outcomes that are not CUDA errors (commsim/scenario/outcomes.py):
wrong data with its largest error, NCCL's transport per pair, a fallback to a legal but
slower backend with the cost model's times, undefined behaviour. Each met on a shipped
scenario and each refused when the run does otherwise."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from commsim.scenario.runner import run_scenario
from commsim.scenario.schema import ScenarioError, load, loads

ROOT = Path(__file__).parents[2]
FID = ROOT / "scenarios" / "fidelity"
BASE = ('[scenario]\nname = "e"\n[topology]\npreset = "hgx-h100-8"\n[placement]\nranks = 2\n'
        '[[group]]\nname = "tp"\nranks = "0..1"\n')


def with_expect(sc, **changes):
    return dataclasses.replace(sc, expectations=tuple(
        dataclasses.replace(e, **changes) if i == 0 else e for i, e in enumerate(sc.expectations)))


@pytest.mark.parametrize("text,says", [
    ('backend = "ipc"\nfallback = "nccl"', "gives backend and fallback"),
    ('transport = "P2P"', "pair: missing"),
    ('transport = "P2P"\npair = [0, 0]', "two different ranks"),
    ('transport = "P2P"\npair = [0, 2]', "rank 2 is out of range"),
    ('wrong_data = true\nmax_error = -1', "expected a number > 0"),
    ('pair = [0, 1]\nleak = true', "pair applies only with transport"),
    ('fallback = "nvshmem"', "unknown backend 'nvshmem'"),
    ('message = "x"\nleak = true', "message applies only with error"),
])
def test_bad_outcome_expectations_are_named(text: str, says: str) -> None:
    with pytest.raises(ScenarioError, match=r"e.toml: \[\[expect\]\] #1.*" + says.replace("(", r"\(")):
        loads(BASE + "[[expect]]\n" + text + "\n", "e.toml")


def test_wrong_data_with_its_max_error() -> None:
    sc = load(FID / "p2p-patched-writes-wrong-data.toml")
    res = run_scenario(sc)
    assert res.ok and not res.errors, res.failures
    assert any(o.startswith("wrong data in group tp: 2 result(s), max error 1.28") for o in res.outcomes)
    off = run_scenario(with_expect(sc, max_error=2.0))
    assert any("with max error 2.0; the largest error is 1.28" in f for f in off.failures)
    # Under the default policy (NCCL, exact) the file must simply pass: no wrong data asked.
    fine = run_scenario(sc, policy="default")
    assert fine.ok and not fine.mismatches and not any("wrong data" in o for o in fine.outcomes)


def test_nccl_transport_per_pair() -> None:
    sc = load(FID / "p2p-patched-writes-wrong-data.toml")
    res = run_scenario(sc)
    # The PHB pair is beyond NCCL's default P2P level PXB (NC3): SHM.
    assert "NCCL transport between ranks 0 and 1: SHM via " in "\n".join(res.outcomes)
    other = dataclasses.replace(sc, expectations=tuple(
        dataclasses.replace(e, transport="P2P") if e.transport else e for e in sc.expectations))
    got = run_scenario(other)
    assert any("expected NCCL transport P2P between ranks 0 and 1 (group tp); NCCL uses SHM"
               in f for f in got.failures)


def test_nccl_transport_is_what_its_set_up_made_on_the_machine() -> None:
    # Processes of one host that do not share a hostname: NCCL's host hash differs per rank,
    # so its set-up on the machine connects the pair over the network, where the rules over
    # the scenario's topology alone (a shared NVSwitch) would say P2P.
    fault = '[[fault]]\nkind = "no_shared_host_identity"\nhost = "hgx-h100-0"\n'
    expect = '[[expect]]\ngroup = "tp"\ntransport = "{}"\npair = [0, 1]\n'
    net = run_scenario(loads(BASE + fault + expect.format("NET"), "e.toml"), policy="default")
    assert net.ok, net.failures
    assert net.nccl_transports["tp"] and net.nccl_transports["tp"][0][2] == "NET"
    p2p = run_scenario(loads(BASE + fault + expect.format("P2P"), "e.toml"), policy="default")
    assert any("expected NCCL transport P2P between ranks 0 and 1 (group tp); NCCL uses NET"
               in f for f in p2p.unmet), p2p.failures
    plain = run_scenario(loads(BASE + expect.format("P2P"), "e.toml"), policy="default")
    assert plain.ok and "NCCL transport between ranks 0 and 1: P2P via " in "\n".join(plain.outcomes)


@pytest.mark.parametrize("preset,host,uses", [("hgx-h100-8", "hgx-h100-0", "P2P via cuMem POSIX fd over NVLink"),
                                               ("dgx1-v100", "dgx1-0", "SHM via host shared memory")])
def test_nccl_keeps_nvlink_over_the_links_still_up(preset: str, host: str, uses: str) -> None:
    # GPU 0 has its link 0 down (row NC28). On an NVSwitch board the other links still reach
    # GPU 1: P2P over NVLink. On DGX-1's cube mesh GPU 0's link 0 is its single link to GPU 1:
    # no NVLink left, and the PCIe path of an NVLink pair is not in the model (SYS): SHM.
    text = (BASE.replace("hgx-h100-8", preset) + f'[[fault]]\nkind = "nvlinks_down"\ngpu = "{host}/0"\n'
            f'[[expect]]\ngroup = "tp"\ntransport = "{uses}"\npair = [0, 1]\n')
    res = run_scenario(loads(text, "e.toml"), policy="default")
    assert res.ok, res.failures
    assert " via ".join(res.nccl_transports["tp"][0][2:]) == uses


def test_fallback_to_a_slower_legal_backend_shows_both_predicted_times() -> None:
    sc = load(FID / "fallback-after-workspace-oom.toml")
    res = run_scenario(sc)
    assert res.ok, res.failures
    line = next(o for o in res.outcomes if "fell back to nccl" in o)
    assert "the best legal is ipc (predicted" in line
    # Without the faults nothing falls back: the expectation is not met.
    clean = run_scenario(dataclasses.replace(sc, faults=()))
    assert any("chose ipc, expected a fallback to nccl" in f for f in clean.failures)
    # A backend as fast as the best is not a slower path.
    same = run_scenario(with_expect(dataclasses.replace(sc, faults=sc.faults[:1]), fallback="symm"))
    assert any("as fast as the best legal backend" in f for f in same.failures), same.failures


def test_undefined_behaviour_expected_by_its_text() -> None:
    sc = load(ROOT / "scenarios/regressions/vllm-46515-profiling-leak.toml")
    res = run_scenario(sc)
    assert res.ok and any("row L15" in o for o in res.outcomes), res.failures
    e = next(x for x in sc.expectations if x.undefined)
    other = dataclasses.replace(sc, expectations=tuple(
        dataclasses.replace(x, message="row MC7") if x is e else x for x in sc.expectations))
    got = run_scenario(other)
    assert any("expected undefined behaviour saying 'row MC7'" in f for f in got.failures)
