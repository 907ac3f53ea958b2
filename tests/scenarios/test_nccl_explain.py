"""`commsim explain` says what NCCL would use (docs/lifecycle-rules.md
NC1-NC12): its transport per pair and algorithm classes per collective, with the NCCL_*
variables that change them, on an HGX host, a GB200 two-tray slice and a PCIe box; and the
NCCL backend fails init where NCCL does."""

from __future__ import annotations

from pathlib import Path

import pytest

from commsim.cli import main
from commsim.policy import Policy
from commsim.scenario.runner import run_scenario
from commsim.scenario.schema import load

NCCL = Path(__file__).resolve().parents[2] / "scenarios" / "nccl"

EXPECT = {
    "hgx-h100-nccl.toml": [
        "NCCL (environment: NCCL_NVLS_ENABLE=0; machine from topology)",
        "transports: P2P via cuMem POSIX fd over NVLink (28 pairs)",
        "all_reduce: algorithm classes Ring, Tree", "all_gather: algorithm classes Ring",
        "NCCL_CUMEM_ENABLE=0: transports -> P2P via legacy IPC over NVLink (28 pairs)"],
    "gb200-two-trays-nccl.toml": [
        "MNNVL on: FABRIC handles across hosts of one NVLink domain",
        "P2P via cuMem FABRIC over multi-node NVLink (16 pairs); P2P via cuMem POSIX fd over NVLink (12 pairs)",
        "all_reduce: algorithm classes Ring, Tree, NVLS",
        "reduce_scatter: algorithm classes Ring, NVLS",
        "NCCL_MNNVL_ENABLE=0: transports -> NET via network (16 pairs)"],
    "pcie-box-nccl.toml": [
        "transports: SHM via host shared memory (6 pairs)", "because: cudaDeviceCanAccessPeer = 0",
        "NVLS off: some GPU lacks multicast", "all_reduce: algorithm classes Ring, Tree",
        "NCCL_SHM_DISABLE=1: transports -> NET via network (6 pairs)"],
}


@pytest.mark.parametrize("name", sorted(EXPECT))
def test_explain_prints_nccl_transports_classes_and_variables(name, capsys):
    assert main(["explain", str(NCCL / name)]) == 0
    out = capsys.readouterr().out
    for line in EXPECT[name]:
        assert line in out, (line, out[-3000:])
    assert "variables that change this:" in out


def test_every_shipped_nccl_scenario_is_explained_here():
    assert sorted(p.name for p in NCCL.glob("*.toml")) == sorted(EXPECT)


@pytest.mark.parametrize("name", sorted(EXPECT))
def test_shipped_nccl_scenarios_pass(name):
    res = run_scenario(load(NCCL / name))
    assert res.ok and not res.errors and not res.leaks, res.failures


def test_nccl_backend_describes_its_choice_and_honours_the_workload_env():
    res = run_scenario(load(NCCL / "pcie-box-nccl.toml"))
    assert "nccl: admitted" in res.explain["world"] and "SHM via host shared memory" in res.explain["world"]
    assert "all_reduce 65536 B -> nccl ring" in res.explain["world"]
    hgx = run_scenario(load(NCCL / "hgx-h100-nccl.toml"), Policy(order=("nccl",)))
    assert "all_reduce 65536 B -> nccl ring" in hgx.explain["world"]     # NVLS switched off
    on = run_scenario(load(NCCL / "gb200-two-trays-nccl.toml"), Policy(order=("nccl",)))
    assert "all_reduce 65536 B -> nccl multicast" in on.explain["world"]


def test_default_policy_follows_nccls_advice_when_imex_is_missing():
    sc = load(NCCL.parent / "regressions" / "nccl-mnnvl-imex-missing.toml")
    res = run_scenario(sc, "default")
    assert res.ok and "NCCL_MNNVL_ENABLE=0 set: MNNVL looks available but IMEX is missing" in res.explain["world"]


def test_duplicate_gpu_fails_nccl_init_on_every_rank():
    sc = load(NCCL / "hgx-h100-nccl.toml")
    from dataclasses import replace
    sc = replace(sc, placement=(sc.placement[0], sc.placement[1], sc.placement[1], sc.placement[2]))
    from commsim.scenario.model import Group
    sc = replace(sc, groups=(Group("world", (0, 1, 2, 3)),))
    res = run_scenario(sc, Policy(order=("nccl",), fallback_on_setup_error=False))
    assert {e.name for e in res.errors} == {"ncclInvalidUsage"} and len(res.errors) == 4
    assert "Duplicate GPU detected : rank 2 and rank 1 both on CUDA device" in res.errors[0].message


def test_explain_never_says_numerics_ok_under_an_error(capsys):
    # Results are compared only for the steps a rank completed: an errored run names what
    # stopped the comparison instead of vouching for numerics it never checked.
    old_driver = NCCL.parent / "fidelity" / "ipc-graph-segment-old-driver.toml"
    assert main(["explain", str(old_driver)]) == 0
    out = capsys.readouterr().out
    assert "error: ranks 0,1" in out and "numerics: ok" not in out
    assert ("numerics: not checked past the errors: ranks 0,1 failed at step register "
            "(cudaErrorAlreadyMapped)") in out
    assert main(["explain", str(NCCL / "pcie-box-nccl.toml")]) == 0
    assert "numerics: ok" in capsys.readouterr().out


def test_explain_prints_what_nccl_set_up_did_on_the_machine():
    """A group that falls back to NCCL: the decision record says what NCCL's set-up did on
    the machine (each pair's transport and why not a nearer one, NVLS on or off and why, when
    it connects), and where set-up failed, the failing call, NCCL's error text and what it
    had decided."""
    fid = NCCL.parent / "fidelity"
    res = run_scenario(load(fid / "p2p-patched-writes-corrupt.toml"))
    line = next(x for x in res.explain["tp"].splitlines() if x.startswith("  nccl: admitted"))
    assert "NCCL on the machine: NVLS off: some GPU lacks multicast" in line, line
    assert "pairs: SHM via host shared memory (path PHB is beyond P2P level PXB): 0-1 (1 pair)" in line
    assert "connections at the first collective (runtime connect)" in line
    res = run_scenario(load(fid / "multicast-container-no-caps.toml"))
    line = next(x for x in res.explain["tp"].splitlines() if x.startswith("  nccl: declined"))
    assert ("ncclUnhandledCudaError: Cuda failure 1 'invalid argument' (cuMulticastCreate -> "
            "CUDA_ERROR_INVALID_VALUE) [NCCL had decided: NVLS on") in line, line
    assert "P2P via cuMem POSIX fd over NVLink: 0-1, 0-2" in line and "(28 pairs)" in line
